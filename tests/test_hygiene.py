"""The hygiene fixture (tests/conftest.py, tests/hygiene.py) fails a test that leaves something behind,
naming it, and lets a fixture of wider scope or a ``leaks`` marker keep things across tests."""

from __future__ import annotations

import threading

import pytest

import tests.hygiene

pytest_plugins = ["pytester"]

#: The inner sessions use this suite's own fixture and marker.
CONFTEST = "from tests.conftest import hygiene, pytest_configure  # noqa: F401\n"

#: Set by the outer test once the inner session is over: the inner tests' threads wait on it.
RELEASE = threading.Event()

INNER = '''
import os
import subprocess
import threading

import pytest

from tests.test_hygiene import RELEASE


def test_env():
    os.environ["RINGTRAIN_HYGIENE_ADDED"] = "1"


def test_env_by_monkeypatch(monkeypatch):
    monkeypatch.setenv("RINGTRAIN_HYGIENE_ADDED", "1")


def test_thread():
    threading.Thread(target=RELEASE.wait, name="hygiene-leaker").start()


def test_daemon_thread():
    threading.Thread(target=RELEASE.wait, name="hygiene-daemon", daemon=True).start()


def test_process():
    subprocess.Popen(["cat"], stdin=subprocess.PIPE)


def test_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)


@pytest.mark.leaks("threads", reason="the test's own thread outlives it on purpose")
def test_marked_thread():
    threading.Thread(target=RELEASE.wait, name="hygiene-allowed").start()


@pytest.mark.leaks("thread", reason="a typo")
def test_unknown_kind():
    pass


@pytest.fixture(scope="module")
def kept():
    thread = threading.Thread(target=RELEASE.wait, name="hygiene-module")
    thread.start()
    return thread


def test_module_fixture_thread(kept):
    assert kept.is_alive()
'''


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    monkeypatch.setattr(tests.hygiene, "GRACE_S", 0.2)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=INNER)
    RELEASE.clear()
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    finally:
        RELEASE.set()
        for thread in threading.enumerate():
            if thread.name.startswith("hygiene-"):
                thread.join(timeout=10)
    return result


def test_leaks_fail_naming_what_leaked_and_the_rest_pass(inner: pytest.RunResult) -> None:
    text = inner.stdout.str()
    inner.assert_outcomes(passed=8, errors=5)
    assert "test_env left behind:\n  environment variables leaked: added RINGTRAIN_HYGIENE_ADDED." in text
    assert "test_thread left behind:\n  non-daemon threads still alive 0.2 s after the test: " \
           "'hygiene-leaker'" in text
    assert "test_process left behind:\n  child processes still alive 0.2 s after the test (now killed): " \
           in text
    assert "(cat)" in text
    assert "test_process_group left behind:\n  a torch.distributed default process group is still " \
           "initialised" in text
    assert "@pytest.mark.leaks('thread',): name kinds among env, process_group, engine, threads, " \
           "processes" in text
    # the module fixture's thread, the daemon thread, the marked thread and monkeypatch's variable pass
    for name in ("test_env_by_monkeypatch", "test_daemon_thread", "test_marked_thread",
                 "test_module_fixture_thread"):
        assert f"ERROR at teardown of {name} " not in text
        assert f"{name} left behind" not in text
    # the module fixture's thread is no leak of the test that used it, nor of the module: only the
    # test's own teardown is checked
    assert "hygiene-module" not in text
