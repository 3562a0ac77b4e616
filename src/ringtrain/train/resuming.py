"""Resuming with other settings: what a snapshot records about its run, and what may change.

A snapshot holds the ``TrainerConfig`` of the run that wrote it (``config``) and, since this module
exists, a ``run`` record: the optimizer's class and its hyperparameters as configured (before any
scaling or schedule), the learning-rate factor of ``scale_lr`` and the number of training items.
A resumed run compares its own settings with them. Each difference is either applied and said in
one line, or refused before the first step with the snapshot's value and the way out; none is
ignored (docs/restarts.md, "Resuming with other settings", has the table):

* refused: ``seed`` (it chose the data order, and ``--subset``'s items, of every epoch) and the
  optimizer's class (its state does not carry over);
* applied and said: the learning rate and the optimizer's other hyperparameters, the epochs, the batch
  size, the ranks, accumulation, precision, strategy, the number of training items;
* applied silently: where snapshots, logs and progress go, threads, loader workers, the device.

The launcher of ``ringtrain train`` makes the same checks on the newest snapshot before it starts any
rank (``refusal`` and ``finished``), so that a refused or finished job costs no start-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: ``ringtrain train --optimizer`` names and the torch classes they build.
OPTIMIZER_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}

#: ``TrainerConfig`` fields that change what is computed: a difference is applied and said.
NOTED_FIELDS = ("epochs", "batch_size", "batches_per_allreduce", "max_steps_per_epoch", "strategy",
                "fp16_allreduce", "compression", "sync_every", "outer_lr", "outer_momentum",
                "shard_optimizer", "amp", "scale_lr", "warmup_epochs")

#: Parameter-group entries that are not settings of the run (torch's schedulers add ``initial_lr``).
_NOT_SETTINGS = ("params", "param_names", "initial_lr")

#: Hyperparameters that ``ringtrain train`` sets from a flag.
_FLAGS = {"lr": "--lr", "momentum": "--momentum", "weight_decay": "--weight-decay"}


def flag(name: str) -> str:
    """The ``ringtrain train`` flag of a ``TrainerConfig`` field or optimizer hyperparameter."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def _plain(value: Any) -> Any:
    """``value`` if it is a plain setting (a number, a flag, a word, or a tuple of them), else None."""
    if isinstance(value, list | tuple):
        items = [_plain(v) for v in value]
        return tuple(items) if all(i is not None for i in items) else None
    return value if isinstance(value, bool | int | float | str) else None


def hyperparameters(param_groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plain settings of each parameter group (lr, momentum, betas, ...), without the parameters."""
    return [{key: plain for key, value in group.items()
             if key not in _NOT_SETTINGS and (plain := _plain(value)) is not None}
            for group in param_groups]


def same(a: Any, b: Any) -> bool:
    """Equal settings (floats within rounding, lists and tuples alike)."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def show(value: Any) -> str:
    """A setting as a user of the flags reads it: a flag left out (a None of the config) is "(unset)", and
    a switch (``--amp``, ``--scale-lr``: True or False in the config) is "on" or "off"."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return ",".join(show(v) for v in value)
    return str(value)


def change(name: str, old: Any, new: Any, where: str = "") -> str:
    """``--lr 0.001 -> 0.01``: one setting that differs from the snapshot's run."""
    return f"{flag(name)}{where} {show(old)} -> {show(new)}"


def scaled_lr_factor(config: Mapping[str, Any], world_size: int) -> float:
    """What ``scale_lr`` multiplied the learning rate by, for a run of ``world_size`` ranks."""
    if not config.get("scale_lr"):
        return 1.0
    return float(world_size * int(config.get("batches_per_allreduce", 1)))


def refusal(path: Any, body: Mapping[str, Any], seed: int, optimizer_class: str | None) -> str | None:
    """Why ``body`` (the snapshot ``path``) cannot be resumed with ``seed`` and ``optimizer_class``, or None.

    ``optimizer_class`` is the torch class name (``SGD``); None skips that comparison.
    """
    config = body.get("config") or {}
    run = body.get("run") or {}
    problems, keep = [], []
    old_seed = config.get("seed")
    if old_seed is not None and old_seed != seed:
        problems.append(f"--seed {seed} (the snapshot's run: --seed {old_seed}; the seed chose the data "
                        "order of every epoch and --subset's items, so a resumed epoch would mix two orders)")
        keep.append(f"--seed {old_seed}")
    old_class = run.get("optimizer")
    if optimizer_class is not None and old_class and old_class != optimizer_class:
        names = {v: k for k, v in OPTIMIZER_CLASSES.items()}
        problems.append(f"--optimizer {names.get(optimizer_class, optimizer_class)} (the snapshot holds the "
                        f"state of {old_class}, which does not carry over to {optimizer_class})")
        keep.append(f"--optimizer {names[old_class]}" if old_class in names else f"a {old_class} optimizer")
    if not problems:
        return None
    return (f"{path} was written with other settings, which a resumed run cannot change: "
            + "; ".join(problems) + f". HINT: resume with {' '.join(keep)}, or start a new run in another "
            "--snapshot-dir.")


def finished(body: Mapping[str, Any], epochs: int) -> bool:
    """Whether the snapshot's run has trained all of ``epochs`` already."""
    return int(body.get("epoch", 0)) >= epochs


def finished_message(path: Any, body: Mapping[str, Any], epochs: int) -> str:
    """What a run that has nothing left to train says."""
    return (f"{path} already holds {int(body.get('epoch', 0))} epoch(s) (--epochs {epochs}): nothing left to "
            "train. HINT: raise --epochs to train on from it, or give a new --snapshot-dir to start afresh.")


def config_changes(body: Mapping[str, Any], config: Mapping[str, Any], world_size: int,
                   train_items: int) -> list[str]:
    """``--batch-size 64 -> 32``-style notes for the computing settings that differ from the snapshot's."""
    old = body.get("config") or {}
    notes = [change(name, old[name], config[name]) for name in NOTED_FIELDS
             if name in old and name in config and not same(old[name], config[name])]
    old_world = body.get("world_size")
    if old_world is not None and int(old_world) != world_size:
        notes.append(f"ranks {int(old_world)} -> {world_size}")
    old_items = (body.get("run") or {}).get("train_items")
    if old_items is not None and int(old_items) != train_items:
        notes.append(f"training items {int(old_items)} -> {train_items}")
    return notes
