"""The Trainer's elastic mode: its whole state as an ``hvd.elastic.State``.

Under ``ringtrain run --min-np/--max-np`` (or ``ringtrain train --min-np/--max-np``) the Trainer runs its
epochs inside ``hvd.elastic.run``. :class:`TrainerState` commits what a snapshot holds (model,
optimizer, scheduler, scaler, counters, RNGs, the epoch's metric totals; see ``Trainer.state``) in
memory at every epoch end and at every ``save_every_steps`` snapshot point. When a worker dies the
survivors restore the last commit and re-form the group; rank 0 (always a survivor) then hands its
commit to every worker, new ones included, and the Trainer re-shards its data and rescales its
learning rate for the new number of workers. Nothing goes through the disk.
"""

from __future__ import annotations

import copy
from typing import Any

from ringtrain import mpi_ops
from ringtrain.elastic.state import State
from ringtrain.functions import broadcast_object

_NAME = "ringtrain.trainer.elastic"


class TrainerState(State):
    """The elastic state of one :class:`~ringtrain.train.trainer.Trainer` (built on every worker)."""

    def __init__(self, trainer: Any) -> None:  # a Trainer (not imported: the Trainer imports this module)
        super().__init__(bcast_object=lambda obj: broadcast_object(obj, 0, name=f"{_NAME}.hosts"),
                         get_rank=mpi_ops.rank)
        self.trainer = trainer
        self._saved: dict[str, Any] | None = None
        """The last commit: the snapshot body and how many epoch results it has seen."""

    def save(self) -> None:
        """Commit (collective: every rank calls it at the same point)."""
        trainer = self.trainer
        # all of this rank's state, what differs from rank to rank included (a snapshot puts that in parts)
        self._saved = {"body": copy.deepcopy(trainer.state(shared=False)), "history": len(trainer.history)}

    def restore(self) -> None:
        """Back to the last commit (this worker's own copy); the sync that follows aligns every rank."""
        if self._saved is not None:
            self._apply(self._saved, "the last commit")

    def sync(self) -> None:
        """Every worker takes rank 0's last commit (the first sync of a job commits first)."""
        if not broadcast_object(self._saved is not None, 0, name=f"{_NAME}.has_commit"):
            self.save()
        mine = self._saved if mpi_ops.rank() == 0 else None
        saved = broadcast_object(mine, 0, name=f"{_NAME}.commit")
        self._saved = saved
        self._apply(saved, "rank 0's last commit")

    def reset(self) -> None:
        """The group was re-formed: new rank and size, new shards, rescaled learning rate."""
        self.trainer.after_reset()

    def _apply(self, saved: dict[str, Any], what: str) -> None:
        trainer = self.trainer
        trainer.load_state(copy.deepcopy(saved["body"]), what)
        del trainer.history[saved["history"]:]
        trainer.match_learning_rate(int(saved["body"]["world_size"]))


__all__ = ["TrainerState"]
