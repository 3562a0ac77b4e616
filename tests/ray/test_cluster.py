"""Reaching a Ray cluster: an address nobody answers on fails within ``timeout_s`` (no cluster started)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.engine.netutil import free_port  # noqa: E402
from ringtrain.ray.cluster import ClusterUnreachableError, connect  # noqa: E402
from ringtrain.ray.executor import RayExecutor  # noqa: E402


@pytest.fixture(autouse=True)
def _no_cluster_here() -> None:
    if ray.is_initialized():  # connect() would reuse it and never try the address
        pytest.skip("a Ray cluster is connected in this process already")


def test_an_address_nobody_answers_on_fails_within_timeout() -> None:
    address = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(ClusterUnreachableError, match=rf"no Ray cluster answers at {address} within 2 s"):
        connect(address, timeout_s=2)
    assert time.monotonic() - began < 30  # generous: the bound is timeout_s plus one connection attempt
    assert not ray.is_initialized()


def test_the_executor_reports_it_from_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{free_port()}")
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=1), num_workers=2)
    with pytest.raises(ClusterUnreachableError, match="ray://127.0.0.1"):
        executor.start()
    assert executor.workers == []


@pytest.mark.parametrize("address", ["10.0.0.1", "head:port", "ray://nowhere"])
def test_an_address_that_is_not_host_port_is_named(address: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        connect(address, timeout_s=1)


def test_a_ray_client_server_that_opens_no_session_is_told_apart_by_the_auth_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The words of the error; the real refusal (a token-authenticated head, a client without the mode)
    is tests/integration/test_ray_two_hosts.py::test_ringtrain_run_ray_through_a_ray_client_address."""
    from ringtrain.ray.cluster import _client_refused

    timeout = ConnectionError("ray client connection timeout")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    text = _client_refused("ray://head:10001", timeout)
    assert text.startswith("the Ray Client server at ray://head:10001 accepted the connection but started no "
                           "session (ray client connection timeout). HINT: ")
    assert "RAY_AUTH_MODE=token where you run this" in text
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    text = _client_refused("ray://head:10001", timeout)
    assert "RAY_AUTH_MODE=token where" not in text
    assert "holds the cluster's token" in text


def _unreachable(address: str, *_: object, **__: object) -> None:
    raise ClusterUnreachableError(f"no Ray cluster answers at {address} within 2 s (connection refused). "
                                  "HINT: start one there with `ray start --head`.")


@pytest.mark.parametrize("command", [
    ["run", "--ray", "10.0.0.1:6379", "-np", "2", "python", "-c", "pass"],
    ["train", "synthetic", "--ray", "10.0.0.1:6379", "-np", "2", "--subset", "8", "--no-progress"],
])
def test_no_cluster_at_connect_is_a_usage_error(command: list[str], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing started: a missing cluster is for the user to fix before the job, as a bad flag (exit 2).
    The decision only: connect() is stubbed, no Ray is started."""
    from ringtrain.cli.main import main
    from ringtrain.ray import cluster

    monkeypatch.setattr(cluster, "connect", _unreachable)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "ringtrain run: error: no Ray cluster answers at 10.0.0.1:6379 within 2 s (connection refused). "
        "HINT: start one there with `ray start --head`."], err


def test_a_cluster_that_cannot_place_the_job_after_connecting_stays_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Past the connection the cluster is there, and its failures are the job's (exit 1), not misuse."""
    from ringtrain.cli.main import main
    from ringtrain.launch.ray import driver as ray_driver
    from ringtrain.ray import cluster

    def no_room(*_: object, **__: object) -> None:
        raise cluster.PlacementTimeoutError("the Ray cluster could not fit 2 workers within 1 s")

    monkeypatch.setattr(cluster, "connect", lambda *_, **__: None)
    monkeypatch.setattr(ray_driver, "place", no_room)
    assert main(["run", "--ray", "10.0.0.1:6379", "-np", "2", "python", "-c", "pass"]) == 1
    assert "could not fit 2 workers" in capsys.readouterr().err


def _client_init_failing(failures: list[str], calls: list[str]):
    """A stand-in for ``ray.init`` toward a Ray Client address that raises each of ``failures`` in turn,
    then connects."""
    def init(address: str | None = None, **_: object) -> None:
        calls.append(address or "")
        if len(calls) <= len(failures):
            raise ConnectionError(failures[len(calls) - 1])
    return init


#: What Ray's client raises when the server's session process died at start (its proxier's words).
SESSION_DIED = ("Initialization failure from server:\nTraceback (most recent call last):\n"
                "  File \"proxier.py\", line 772, in Datapath\nRuntimeError: Starting Ray client server "
                "failed. See ray_client_server_23000.err for detailed logs.")


def test_a_session_process_that_died_at_start_is_connected_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from ringtrain.ray import cluster

    calls: list[str] = []
    monkeypatch.setattr(cluster, "_check_reachable", lambda *_: None)
    monkeypatch.setattr(ray, "init", _client_init_failing([SESSION_DIED, SESSION_DIED], calls))
    connect("ray://head:10001", timeout_s=1, quiet=True)
    assert calls == ["ray://head:10001"] * 3


def test_a_session_process_that_keeps_dying_is_the_error_after_the_last_attempt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ringtrain.ray import cluster

    calls: list[str] = []
    monkeypatch.setattr(cluster, "_check_reachable", lambda *_: None)
    monkeypatch.setattr(ray, "init", _client_init_failing([SESSION_DIED] * 5, calls))
    with pytest.raises(ClusterUnreachableError, match="(?s)no session .*Starting Ray client server failed"):
        connect("ray://head:10001", timeout_s=1)
    assert len(calls) == cluster.CLIENT_SESSION_ATTEMPTS


def test_a_refused_session_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timeout (the token case, and any other) is the user's to fix: one attempt, then the error."""
    from ringtrain.ray import cluster

    calls: list[str] = []
    monkeypatch.setattr(cluster, "_check_reachable", lambda *_: None)
    monkeypatch.setattr(ray, "init", _client_init_failing(["ray client connection timeout"] * 3, calls))
    with pytest.raises(ClusterUnreachableError, match="started no session"):
        connect("ray://head:10001", timeout_s=1)
    assert len(calls) == 1
