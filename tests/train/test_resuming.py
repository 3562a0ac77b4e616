"""The rules for resuming with other settings: what is refused, what is applied and said."""

from __future__ import annotations

import torch

from ringtrain.train.config import TrainerConfig
from ringtrain.train.resuming import (
    change,
    config_changes,
    finished,
    finished_message,
    hyperparameters,
    refusal,
    same,
    scaled_lr_factor,
)


def _body(**fields) -> dict:
    config = TrainerConfig(epochs=3, batch_size=64, seed=0).as_dict()
    body = {"epoch": 1, "batch_in_epoch": 0, "world_size": 2, "config": config,
            "run": {"optimizer": "SGD", "hyperparameters": [{"lr": 0.1}], "lr_factor": 1.0,
                    "train_items": 1000}}
    for key, value in fields.items():
        if key in config:
            config[key] = value
        else:
            body[key] = value
    return body


def test_the_same_settings_are_no_refusal():
    assert refusal("snap.pt", _body(), seed=0, optimizer_class="SGD") is None


def test_another_seed_is_refused_naming_both_values_and_the_way_out():
    message = refusal("snap.pt", _body(seed=5), seed=0, optimizer_class="SGD")
    assert message is not None
    assert message.startswith("snap.pt was written with other settings")
    assert "--seed 0 (the snapshot's run: --seed 5" in message
    assert "HINT: resume with --seed 5, or start a new run in another --snapshot-dir" in message
    # a command-line message names flags, never the Python API's fields
    assert "TrainerConfig" not in message


def test_another_optimizer_is_refused_by_its_flag_name():
    message = refusal("snap.pt", _body(), seed=0, optimizer_class="Adam")
    assert message is not None
    assert "--optimizer adam (the snapshot holds the state of SGD" in message
    assert "HINT: resume with --optimizer sgd" in message
    # both at once: one message naming both
    both = refusal("snap.pt", _body(seed=1), seed=0, optimizer_class="Adam")
    assert "--seed 0 (" in both
    assert "--optimizer adam (" in both
    assert "HINT: resume with --seed 1 --optimizer sgd" in both


def test_a_snapshot_without_a_run_record_is_checked_for_what_it_has():
    body = _body()
    del body["run"]
    assert refusal("snap.pt", body, seed=0, optimizer_class="Adam") is None  # the class is unknown
    assert refusal("snap.pt", body, seed=2, optimizer_class="Adam") is not None


def test_finished_counts_epochs_done():
    assert finished(_body(epoch=3), 3)
    assert finished(_body(epoch=3, batch_in_epoch=4), 2)
    assert not finished(_body(epoch=2), 3)
    text = finished_message("snap.pt", _body(epoch=3), 3)
    assert "snap.pt already holds 3 epoch(s) (--epochs 3): nothing left to train" in text
    assert "HINT: raise --epochs" in text


def test_config_changes_name_each_computing_setting_by_its_flag():
    config = TrainerConfig(epochs=5, batch_size=32, seed=0, scale_lr=True, threads=7, progress=False)
    notes = config_changes(_body(), config.as_dict(), world_size=4, train_items=500)
    assert notes == ["--epochs 3 -> 5", "--batch-size 64 -> 32", "--scale-lr off -> on", "ranks 2 -> 4",
                     "training items 1000 -> 500"]
    same_config = TrainerConfig(epochs=3, batch_size=64, seed=0, threads=7).as_dict()
    assert config_changes(_body(), same_config, world_size=2, train_items=1000) == []


def test_hyperparameters_are_the_plain_settings_of_each_group():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.5}], lr=0.1)
    groups = hyperparameters(optimizer.param_groups)
    assert [g["lr"] for g in groups] == [0.1, 0.5]
    assert groups[0]["betas"] == (0.9, 0.999)
    assert "params" not in groups[0]
    assert same(groups[0]["betas"], [0.9, 0.999])  # a list read back from a snapshot is the same
    assert same(0.1, 0.1 + 1e-18)
    assert not same(0.1, 0.2)
    assert not same(True, 1)
    assert change("weight_decay", 0.0, 0.01) == "--weight-decay 0 -> 0.01"
    # a flag that was left out is shown as unset, not as Python's None
    assert change("max_steps_per_epoch", None, 10) == "--max-steps-per-epoch (unset) -> 10"
    assert change("max_steps_per_epoch", 10, None) == "--max-steps-per-epoch 10 -> (unset)"
    # a switch is on or off, not Python's True or False
    assert change("amp", False, True) == "--amp off -> on"
    assert change("fp16_allreduce", True, False) == "--fp16-allreduce on -> off"


def test_scaled_lr_factor():
    assert scaled_lr_factor({"scale_lr": False}, 4) == 1.0
    assert scaled_lr_factor({"scale_lr": True, "batches_per_allreduce": 2}, 4) == 8.0
