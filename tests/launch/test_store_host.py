"""launch/store_host.py: how a driver hands the job's secret to an agent (its stdin, never a command line)."""

from __future__ import annotations

import io
import os

import pytest

from ringtrain.launch import store_host
from tests.ranks import free_port


def _pipe_with(data: bytes, close: bool = True) -> tuple[int, int]:
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    if close:
        os.close(write_end)
        write_end = -1
    return read_end, write_end


def test_the_secret_line_is_read_alone_and_the_rest_of_stdin_stays_unread():
    # (adapted from the security branch's test of its private line: the same handover, main's format)
    sent = io.BytesIO()
    store_host.send_secret(sent, "f" * 64)
    read_end, _ = _pipe_with(sent.getvalue() + b"whatever follows stays unread")
    try:
        assert store_host.read_secret(read_end, timeout=30) == "f" * 64
        assert os.read(read_end, 100) == b"whatever follows stays unread"
    finally:
        os.close(read_end)


def test_an_empty_line_means_no_secret_and_an_early_end_means_the_driver_went_away():
    read_end, _ = _pipe_with(b"\n")
    try:
        assert store_host.read_secret(read_end, timeout=30) is None
    finally:
        os.close(read_end)
    for data in (b"", b"abc"):  # nothing at all, or half a line: the driver went away
        read_end, _ = _pipe_with(data)
        try:
            with pytest.raises(EOFError):
                store_host.read_secret(read_end, timeout=30)
        finally:
            os.close(read_end)


def test_the_job_store_takes_its_handshake_timeout_from_the_environment():
    server = store_host.host_job_store(f"127.0.0.1:{free_port()}", "a" * 64,
                                       {"RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS": "600"})
    try:
        assert server.handshake_timeout == 600
    finally:
        server.close()
    with pytest.raises(store_host.UsageError, match="RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS"):
        store_host.host_job_store(f"127.0.0.1:{free_port()}", "a" * 64,
                                  {"RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS": "-1"})


def test_a_short_secret_is_a_usage_error_whose_hint_makes_a_secret_that_is_accepted():
    import subprocess

    from ringtrain.engine import auth
    from ringtrain.exceptions import UsageError

    with pytest.raises(UsageError, match="RINGTRAIN_JOB_SECRET holds 7 characters") as caught:
        store_host.node_secret({"RINGTRAIN_JOB_SECRET": "hunter2"}, whole_job_here=True)
    hint = str(caught.value).split("HINT: ", 1)[1].split(" (the same on every node)", 1)[0]
    # the hint, run in a shell where the short secret is still exported, replaces it
    shell = subprocess.run(["bash", "-c", f"{hint} && printf %s \"$RINGTRAIN_JOB_SECRET\""],
                           capture_output=True, text=True, timeout=60, check=True,
                           env={**os.environ, "RINGTRAIN_JOB_SECRET": "hunter2"})
    fixed = shell.stdout
    assert len(fixed) >= auth.MIN_SECRET_CHARS
    assert store_host.node_secret({"RINGTRAIN_JOB_SECRET": fixed}, whole_job_here=True) == fixed


def test_ringtrain_run_refuses_a_short_secret_with_exit_2_and_no_traceback():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ringtrain.cli.main", "run", "-np", "2", sys.executable,
                           "-c", "pass"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RINGTRAIN_JOB_SECRET": "hunter2"})
    assert proc.returncode == 2, proc.stderr
    assert "ringtrain run: error: RINGTRAIN_JOB_SECRET holds 7 characters" in proc.stderr
    assert "Traceback" not in proc.stderr
