"""Signals a launcher passes on as themselves (launch/forwarding.py): caught in the block, put back after."""

import os
import signal
import subprocess
import threading

from ringtrain.launch.forwarding import FORWARDED_SIGNALS, forwarding, signal_pids


def test_a_forwarded_signal_calls_send_instead_of_ending_the_process_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGUSR1)
    got = []
    with forwarding(got.append):
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
    assert got == [signal.SIGUSR1, signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR1) == before
    assert set(FORWARDED_SIGNALS) == {signal.SIGUSR1, signal.SIGUSR2}  # the stop signals are not passed on


def test_outside_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGUSR1)
    seen = []

    def body():
        with forwarding(print):
            seen.append(signal.getsignal(signal.SIGUSR1))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]


def test_signal_pids_skips_a_process_that_is_gone():
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=60)
    child = subprocess.Popen(["sleep", "60"])
    try:
        signal_pids([gone.pid, child.pid], signal.SIGUSR1)
        assert child.wait(timeout=60) == -signal.SIGUSR1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
