"""Synthetic images and ratings: seeded, any shape, learnable, and honest about ignored arguments."""

from __future__ import annotations

import pytest
import torch

from ringtrain.workloads import get_workload


def test_images_default_shape_and_sizes() -> None:
    wl = get_workload("synthetic")
    train, test = wl.datasets()
    assert (len(train), len(test)) == (10000, 2000)
    assert train.features.shape[1:] == (3, 32, 32)
    assert set(train.targets.unique().tolist()) == set(range(10))


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 64, 48), (2, 1, 1)])
def test_images_any_shape(shape: tuple[int, int, int]) -> None:
    wl = get_workload("synthetic", shape=shape, num_classes=4, size=40)
    train, test = wl.datasets()
    assert train.features.shape == (40, *shape)
    assert len(test) == 8
    assert int(train.targets.max()) < 4
    assert wl.model("cnn")(train.features[:2]).shape == (2, 4)


def test_images_resnet_option() -> None:
    wl = get_workload("synthetic", shape=(1, 8, 8), num_classes=3, size=4)
    train, _ = wl.datasets()
    assert wl.model("resnet18").eval()(train.features).shape == (4, 3)


def test_images_are_seeded() -> None:
    wl = get_workload("synthetic", size=50)
    a, _ = wl.datasets(seed=5)
    b, _ = wl.datasets(seed=5)
    c, _ = wl.datasets(seed=6)
    assert torch.equal(a.features, b.features)
    assert torch.equal(a.targets, b.targets)
    assert not torch.equal(a.features, c.features)


def test_images_are_learnable_but_not_trivially_separable() -> None:
    # the old task (a class pattern plus noise) was solved by nearest class means: loss 0.0000 at once
    train, test = get_workload("synthetic", size=2000, test_size=1000).datasets()
    means = torch.stack([train.features[train.targets == k].mean(0) for k in range(10)])
    distances = torch.cdist(test.features.flatten(1), means.flatten(1))
    assert (distances.argmin(1) == test.targets).float().mean() < 0.75  # the old task: about 1.0
    # the labels follow the teacher's rule on the coarse pattern, with some randomness on top
    wl = get_workload("synthetic")
    pattern = torch.nn.functional.avg_pool2d(test.features, 8).flatten(1)  # 4x4 cells of 8x8 pixels
    agreement = (wl.teacher(0).scores(pattern).argmax(1) == test.targets).float().mean()
    assert 0.6 < agreement < 0.97


def test_every_class_occurs() -> None:
    train, _ = get_workload("synthetic", size=2000).datasets()
    counts = torch.bincount(train.targets, minlength=10)
    assert int(counts.min()) > 2000 / 10 / 3


@pytest.mark.parametrize(("like", "shape", "classes", "sizes"), [
    ("mnist", (1, 28, 28), 10, (60_000, 10_000)),
    ("cifar10", (3, 32, 32), 10, (50_000, 10_000)),
    ("imagenet", (3, 224, 224), 1000, (1_281_167, 50_000)),
])
def test_like_a_real_data_set(like, shape, classes, sizes) -> None:
    wl = get_workload("synthetic", like=like)
    assert (wl.shape, wl.num_classes, wl.size, wl.test_size) == (shape, classes, *sizes)
    train, test = wl.datasets(subset=None if like != "imagenet" else None)
    assert (len(train), len(test)) == sizes
    image, label = train[3]
    assert image.shape == shape
    assert 0 <= int(label) < classes


def test_a_large_split_is_made_item_by_item_and_equals_the_one_in_memory() -> None:
    from ringtrain.workloads.synthetic import SyntheticImages

    train, _ = get_workload("synthetic", like="imagenet").datasets()
    assert isinstance(train, SyntheticImages)  # 1.3 M images of 600 KB are never all in memory
    small = get_workload("synthetic", size=50)
    held, _ = small.datasets(seed=4)
    lazy = SyntheticImages(small, 0, 50, seed=4)
    for index in (0, 17, 49):
        assert torch.equal(held[index][0], lazy[index][0])
        assert torch.equal(held[index][1], lazy[index][1])


def test_the_default_is_cifar_shaped_for_benchmarks() -> None:
    wl = get_workload("synthetic")
    assert (wl.shape, wl.num_classes) == ((3, 32, 32), 10)
    train, _ = wl.datasets(subset=8)
    assert wl.model("resnet18").eval()(train.features).shape == (8, 10)


def test_subset_limits_the_generated_items() -> None:
    train, test = get_workload("synthetic").datasets(subset=64)
    assert (len(train), len(test)) == (64, 64)


@pytest.mark.parametrize("kwargs", [{"shape": (28, 28)}, {"num_classes": 0}, {"size": -1},
                                    {"shape": (3, 0, 4)}, {"test_size": 0}, {"like": "svhn"},
                                    {"noise": -1.0}, {"label_temperature": 0.0}])
def test_bad_options(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="HINT:"):
        get_workload("synthetic", **kwargs)


def test_data_arguments_have_no_effect_and_say_so(tmp_path) -> None:
    with pytest.warns(UserWarning, match="no effect"):
        get_workload("synthetic", size=10).datasets(data_dir=tmp_path)


def test_ratings() -> None:
    wl = get_workload("synthetic-ratings", num_users=50, num_items=30, size=1000)
    train, test = wl.datasets(seed=1)
    assert (len(train), len(test)) == (800, 200)
    users, items = train.features
    assert int(users.max()) < 50
    assert int(items.max()) < 30
    assert float(train.targets.min()) >= 0.5
    assert float(train.targets.max()) <= 5.0
    assert wl.task == "regression"
    again, _ = get_workload("synthetic-ratings", num_users=50, num_items=30, size=1000).datasets(seed=1)
    assert torch.equal(train.targets, again.targets)
    assert wl.model()(users[:3], items[:3]).shape == (3,)
