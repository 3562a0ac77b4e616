"""Values a Ray executor's ranks send to the driver's callbacks: Horovod's ``horovod.ray.ray_logger``.

A function that ``RayExecutor.run`` / ``execute`` or ``ElasticRayExecutor.run`` runs calls
:func:`log` with a value (a dict of metrics, say); on the driver every callback given to that call
(``callbacks=[...]``) is called with each value while the job runs, in the order they were logged.
``chief_only`` (the default) sends rank 0's values only, as Horovod did.

The values travel differently by executor. A fixed-size executor's ranks are Ray actors: a Ray queue
(an actor of no CPUs) that :class:`CallbackRelay` drains. An elastic job's ranks are processes of
``ringtrain run --ray`` that never join the Ray cluster: they append each value to a key of the job
store the executor hosts (:class:`StoreSink`), which the driver reads (:func:`read_frames`).
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: The job-store key an elastic job's ranks append their values to.
LOG_KEY = "elastic-call/log"
#: Seconds between two looks at the queue or the key: how late a callback may see a value.
POLL_S = 0.25
_FRAME = struct.Struct("!Q")

_sink: Any = None
_warned = False


def configure(sink: Any) -> None:
    """Where :func:`log` sends values in this process: anything with ``put(value)`` (None: nowhere)."""
    global _sink
    _sink = sink


def log(info_dict: Any, chief_only: bool = True) -> None:
    """Send ``info_dict`` to the driver's callbacks (rank 0's only, unless ``chief_only`` is False).

    Outside a call that was given callbacks the value goes nowhere, with one warning per process.
    """
    global _warned
    if chief_only and _rank() != 0:
        return
    if _sink is not None:
        _sink.put(info_dict)
    elif not _warned:
        _warned = True
        warnings.warn("ray_logger.log() was called, but the executor's call was given no callbacks: the "
                      "value goes nowhere. HINT: pass callbacks=[...] to run() or execute().", stacklevel=2)


def _rank() -> int:
    """This process's rank now: the engine's once initialized (an elastic job's ranks change between
    generations), else the variables the rank was started with."""
    basics = sys.modules.get("ringtrain.ops.basics")
    if basics is not None and basics.is_initialized():
        return int(basics.rank())
    return int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")) or 0)


def call_each(callbacks: Sequence[Callable[[Any], Any]], value: Any) -> None:
    for callback in callbacks:
        callback(value)


# --- a fixed-size executor: a Ray queue ---------------------------------------------------------------

class CallbackRelay:
    """The driver's side for actors: a Ray queue the ranks put to, drained on a thread into the
    callbacks; :meth:`close` takes what is left, ends the queue and raises a callback's error."""

    def __init__(self, callbacks: Iterable[Callable[[Any], Any]]) -> None:
        from ray.util.queue import Queue

        self.callbacks = list(callbacks)
        self.queue = Queue(actor_options={"num_cpus": 0})
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="ringtrain-ray-callbacks", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        from ray.util.queue import Empty

        while True:
            try:
                value = self.queue.get(block=True, timeout=POLL_S)
            except Empty:
                if self._done.is_set():
                    return
                continue
            except Exception:  # the queue's actor went away (the cluster is ending)
                return
            if self.error is None:
                try:
                    call_each(self.callbacks, value)
                except BaseException as exc:  # raised on the caller's thread by close()
                    self.error = exc

    def close(self) -> None:
        """Wait until every value put so far reached the callbacks, then end the queue."""
        self._done.set()
        self._thread.join()
        with contextlib.suppress(Exception):
            self.queue.shutdown()
        if self.error is not None:
            raise self.error


# --- an elastic job: a job-store key ------------------------------------------------------------------

class StoreSink:
    """An elastic rank's sink: each value cloudpickled and appended to :data:`LOG_KEY` as one frame
    (its length, then its bytes), so that values of several ranks never interleave."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def put(self, value: Any) -> None:
        import cloudpickle

        body = cloudpickle.dumps(value)
        self.store.append(LOG_KEY, _FRAME.pack(len(body)) + body)


def read_frames(data: bytes, offset: int) -> tuple[list[Any], int]:
    """The values of the whole frames in ``data`` after ``offset``, and the offset after them."""
    import cloudpickle

    values = []
    while offset + _FRAME.size <= len(data):
        (length,) = _FRAME.unpack_from(data, offset)
        end = offset + _FRAME.size + length
        if end > len(data):
            break
        values.append(cloudpickle.loads(data[offset + _FRAME.size:end]))
        offset = end
    return values, offset


class StoreRelay:
    """The driver's side for an elastic job: reads :data:`LOG_KEY` of the executor's store on a thread
    and calls the callbacks with each new value; :meth:`close` reads the rest and raises a callback's
    error."""

    def __init__(self, store: Any, callbacks: Iterable[Callable[[Any], Any]]) -> None:
        self.store = store.clone()  # a connection of its own: the caller's is busy with the job
        self.callbacks = list(callbacks)
        self.error: BaseException | None = None
        self._offset = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ringtrain-elastic-callbacks", daemon=True)
        self._thread.start()

    def _take(self) -> None:
        if not self.store.check([LOG_KEY]):
            return
        values, self._offset = read_frames(self.store.get(LOG_KEY), self._offset)
        for value in values:
            if self.error is None:
                try:
                    call_each(self.callbacks, value)
                except BaseException as exc:  # raised on the caller's thread by close()
                    self.error = exc

    def _watch(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while not self._done.wait(POLL_S):
                self._take()

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        with contextlib.suppress(ConnectionError, OSError):
            self._take()
        self.store.close()
        if self.error is not None:
            raise self.error


__all__ = ["LOG_KEY", "CallbackRelay", "StoreRelay", "StoreSink", "configure", "log", "read_frames"]
