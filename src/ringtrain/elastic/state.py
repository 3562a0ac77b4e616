"""State that survives an elastic reset: save on commit, restore after a failure, sync after a reset.

``State`` is the base (reset callbacks, ``commit``, ``check_host_updates``); ``ObjectState`` keeps
plain attributes; ``TorchState`` adds handlers for models, optimizers and samplers. The handler
registry (``get_handler_registry`` / ``set_handler_registry``) maps a type to the handler class used
for attributes of that type, so other kinds of objects can be made elastic.
"""

from __future__ import annotations

import copy
import enum
import queue
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ringtrain import mpi_ops
from ringtrain.elastic.sampler import ElasticSampler
from ringtrain.engine import elastic_rendezvous
from ringtrain.exceptions import HostsUpdatedInterrupt
from ringtrain.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class HostUpdateResult(enum.IntFlag):
    """What a host update did: hosts added, removed, or both."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class State:
    """Base class: what elastic training needs from the objects it protects.

    ``bcast_object(obj)`` broadcasts from rank 0; ``get_rank()`` returns this process's rank.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[tuple[float, HostUpdateResult]] = queue.Queue()
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call these (in order) after every reset, e.g. to rescale the learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called after the world was re-initialized."""
        self._host_messages = queue.Queue()
        # Updates the new group does not include yet (heard while re-initializing) still count.
        for timestamp, result in elastic_rendezvous.pending_updates():
            self._host_messages.put((timestamp, HostUpdateResult(result)))
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """Record a host-update notification (from the elastic driver: the result as a plain int)."""
        self._host_messages.put((timestamp, HostUpdateResult(update_res)))

    def commit(self) -> None:
        """Save the state, then check (collectively) whether the hosts changed."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if rank 0 saw a host update.

        A collective: every rank must call it at the same point.
        """
        previous = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > self._last_updated_timestamp:
                self._last_updated_timestamp = timestamp
                update |= result
        previous, self._last_updated_timestamp, update = self._bcast_object(
            (previous, self._last_updated_timestamp, update))
        if self._last_updated_timestamp > previous:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self) -> None:
        """Remember the current state in memory (the last good point)."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last saved state."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state equal to rank 0's."""
        raise NotImplementedError

    def reset(self) -> None:
        """Hook for subclasses, run on reset before the callbacks."""


class ObjectState(State):
    """Plain attributes given as keyword arguments; ``sync`` broadcasts the saved values."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        """Snapshot the attribute values (references, not copies)."""
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        """Set the attributes back to the snapshot."""
        self._set_attrs()

    def sync(self) -> None:
        """Broadcast the snapshot from rank 0 and set the attributes from it."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


class StateHandler:
    """Save/restore/sync one attribute value of a ``TorchState``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        """Snapshot the value."""
        raise NotImplementedError

    def restore(self) -> None:
        """Load the snapshot back into the value."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make the value equal to rank 0's."""
        raise NotImplementedError

    def set_value(self, value: Any) -> None:
        """The attribute was assigned a new object: handle that one from now on."""
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """Anything with ``state_dict`` / ``load_state_dict``: saved as a deep copy, restored by loading it."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    """An ``nn.Module``: deep-copied ``state_dict``; synced with ``broadcast_parameters``."""

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    """A torch optimizer: deep-copied ``state_dict``; synced with ``broadcast_optimizer_state``."""

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    """An ``ElasticSampler``: deep-copied ``state_dict``; synced with ``broadcast_object``."""

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), name="ElasticSampler.state"))


_handler_registry: list[tuple[type, type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """The (type, handler class) pairs ``TorchState`` consults, first match wins."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    """Replace the handler registry."""
    global _handler_registry
    _handler_registry = registry


def _handler_for(value: Any) -> StateHandler | None:
    for kind, handler_cls in _handler_registry:
        if isinstance(value, kind):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """Elastic state of a torch training job: model, optimizer, samplers and plain attributes.

    ``TorchState(model, optimizer, epoch=0, batch=0)``: objects with a registered handler are saved by
    deep copy and synced with the matching broadcast; other keyword arguments behave as in
    ``ObjectState``. Assigning a new object to a handled attribute hands it to the handler.
    """

    _handlers: dict[str, StateHandler]  # set in __init__, past this class's own __setattr__

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=mpi_ops.rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        """After a re-initialization: samplers re-read rank and size (a reset that skips the sync too)."""
        for handler in self._handlers.values():
            if isinstance(handler.value, ElasticSampler):
                handler.value.reset()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["HostUpdateResult", "ModelStateHandler", "ObjectState", "OptimizerStateHandler",
           "SamplerStateHandler", "State", "StateHandler", "TorchState", "get_handler_registry",
           "set_handler_registry"]
