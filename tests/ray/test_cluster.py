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
    from ringtrain.launch import ray_driver
    from ringtrain.ray import cluster

    def no_room(*_: object, **__: object) -> None:
        raise cluster.PlacementTimeoutError("the Ray cluster could not fit 2 workers within 1 s")

    monkeypatch.setattr(cluster, "connect", lambda *_, **__: None)
    monkeypatch.setattr(ray_driver, "place", no_room)
    assert main(["run", "--ray", "10.0.0.1:6379", "-np", "2", "python", "-c", "pass"]) == 1
    assert "could not fit 2 workers" in capsys.readouterr().err
