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
