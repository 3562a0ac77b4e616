"""The stall inspector: rank 0 names the missing ranks; optional stall shutdown."""

from __future__ import annotations

import logging
import time

import pytest
import torch

import ringtrain.mpi_ops as hvd
from ringtrain.exceptions import HorovodInternalError
from tests.engine.hvd_env import fresh


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _stall_warning() -> list[str]:
    fresh({"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    collect = _Collect()
    logger = logging.getLogger("ringtrain.engine.stall")
    logger.addHandler(collect)
    try:
        rank = hvd.rank()
        # Uncached name: rank 1 arrives late.
        if rank == 0:
            handle = hvd.allreduce_async(torch.ones(1), name="lonely")
        else:
            time.sleep(3.5)
            handle = hvd.allreduce_async(torch.ones(1), name="lonely")
        hvd.synchronize(handle)
        # Cached name: rank 0 arrives late; rank 0 learns about it from rank 1's report.
        hvd.allreduce(torch.ones(1), name="cached")
        if rank == 0:
            time.sleep(3.5)
        hvd.allreduce(torch.ones(1), name="cached")
    finally:
        logger.removeHandler(collect)
    fresh()
    return collect.messages


@pytest.mark.slow  # two ranks wait out the check time twice (7 s): outside the contributor's 4-minute lane
def test_stall_warning_names_missing_ranks_and_tensors(ranks2):
    warnings, quiet = ranks2.run(_stall_warning)
    assert quiet == [], "only rank 0 reports stalls"
    text = "\n".join(warnings)
    assert (
        "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks" in text
    )
    assert "Missing ranks:\n1: [allreduce.lonely]" in text
    assert "0: [allreduce.cached]" in text


def _stall_shutdown() -> str:
    fresh({"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    message = ""
    if hvd.rank() == 0:
        with pytest.raises(HorovodInternalError) as info:
            hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="never"))
        message = str(info.value)
    else:
        with pytest.raises(HorovodInternalError):  # the engine stops on its own
            for i in range(150):
                time.sleep(0.2)
                hvd.allreduce_async(torch.ones(1), name=f"probe{i}")
    fresh()
    return message


def test_stall_shutdown_stops_every_rank(ranks2):
    message = ranks2.run(_stall_shutdown)[0]
    assert message.startswith("Horovod has been shut down")
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in message


def test_the_warning_is_given_once_per_stall_with_how_to_end_the_job(monkeypatch, caplog):
    from ringtrain.engine import stall

    now = [100.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: now[0])
    inspector = stall.StallInspector(check_time=60.0)
    waiting = {"allreduce.w": (0.0, {0}, [0, 1])}
    with caplog.at_level(logging.WARNING, logger="ringtrain.engine.stall"):
        assert inspector.check(waiting) is False
        now[0] = 1000.0  # the same stall, many check times later: not said again
        inspector.check(waiting)
        assert len(caplog.records) == 1
        assert "Missing ranks:\n1: [allreduce.w]" in caplog.text
        assert "not repeated" in caplog.text
        assert "--hang-timeout SECONDS" in caplog.text
        inspector.check({**waiting, "allreduce.b": (0.0, {0}, [0, 1])})  # a name it did not tell
        assert len(caplog.records) == 2
        inspector.check({})  # the stall is over
        inspector.check(waiting)  # and a new one is told again
        assert len(caplog.records) == 3
