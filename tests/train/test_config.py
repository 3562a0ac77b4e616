"""TrainerConfig validation: every bad value is refused with a message naming it and a HINT."""

import dataclasses

import pytest

from ringtrain.train import TrainerConfig


def test_defaults_are_valid_and_frozen():
    config = TrainerConfig()
    assert config.strategy == "ddp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3  # type: ignore[misc]


@pytest.mark.parametrize(("changes", "named"), [
    ({"epochs": 0}, "epochs=0"),
    ({"batch_size": -1}, "batch_size=-1"),
    ({"batch_size": 2.5}, "batch_size=2.5"),
    ({"batches_per_allreduce": 0}, "batches_per_allreduce=0"),
    ({"keep_last": 0}, "keep_last=0"),
    ({"save_every": 0, "snapshot_dir": "s"}, "save_every=0"),
    ({"save_every_steps": -3, "snapshot_dir": "s"}, "save_every_steps=-3"),
    ({"strategy": "fsdp"}, "strategy='fsdp'"),
    ({"task": "ranking"}, "task='ranking'"),
    ({"warmup_epochs": -1.0, "scale_lr": True}, "warmup_epochs=-1.0"),
    ({"warmup_epochs": 2.0}, "scale_lr"),
    ({"save_every": 1}, "snapshot_dir"),
    ({"device": "tpu"}, "device='tpu'"),
    ({"threads": 0}, "threads=0"),
    ({"num_workers": -1}, "num_workers=-1"),
    ({"seed": -5}, "seed=-5"),
    ({"epochs": True}, "epochs=True"),
    ({"compression": "zstd"}, "compression='zstd'"),
    ({"compression": "powersgd:0"}, "compression='powersgd:0'"),
    ({"compression": "bf16", "fp16_allreduce": True}, "fp16_allreduce=True"),
    ({"sync_every": 0}, "sync_every=0"),
    ({"sync_every": 8, "outer_lr": 0.0}, "outer_lr=0.0"),
    ({"sync_every": 8, "outer_lr": float("inf")}, "outer_lr=inf"),
    ({"sync_every": 8, "outer_momentum": 1.0}, "outer_momentum=1.0"),
    ({"sync_every": 8, "outer_momentum": -0.1}, "outer_momentum=-0.1"),
    ({"outer_lr": 0.7}, "sync_every"),
    ({"sync_every": 8, "compression": "powersgd"}, "sync_every=8"),
    ({"sync_every": 8, "compression": "auto"}, "compression='auto'"),
    ({"shard_optimizer": True, "sync_every": 4}, "shard_optimizer=True"),
    ({"shard_optimizer": 1}, "shard_optimizer=1"),
])
def test_bad_values_are_named_with_a_hint(changes, named):
    with pytest.raises(ValueError, match="HINT") as info:
        TrainerConfig(**changes)
    assert named in str(info.value)


def test_replace_validates_again():
    config = TrainerConfig(epochs=2)
    assert config.replace(epochs=5).epochs == 5
    with pytest.raises(ValueError, match="epochs=0"):
        config.replace(epochs=0)


def test_as_dict_round_trips():
    config = TrainerConfig(epochs=4, snapshot_dir="snaps", save_every=2, strategy="horovod")
    assert TrainerConfig(**config.as_dict()) == config


def test_the_exchange_method_of_each_setting():
    assert TrainerConfig().exchange_method().label == "fp32"
    assert TrainerConfig(fp16_allreduce=True).exchange_method().label == "fp16"
    assert TrainerConfig(compression="fp16", fp16_allreduce=True).exchange_method().label == "fp16"
    assert TrainerConfig(compression="powersgd").exchange_method().label == "powersgd:4"
    assert TrainerConfig(compression="PowerSGD:8").exchange_method().label == "powersgd:8"
    assert TrainerConfig(compression="auto").exchange_method().name == "auto"
    local = TrainerConfig(sync_every=8, outer_lr=0.7, outer_momentum=0.9, compression="bf16")
    assert local.exchange_method().label == "localsgd:8"
    assert local.wire_compression() == "bf16"
