"""Horovod's ``Coordinator`` as Ray Train V1's HorovodTrainer drives it, and the shim modules Ray imports.

No Ray cluster: the two cluster look-ups are replaced; the job store opened is real. Ray's own
trainer on a cluster is tested in tests/ray/test_train.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.engine import job_store
from ringtrain.env import detect_environment
from ringtrain.ray import coordinator as coordinator_module
from ringtrain.ray.coordinator import Coordinator, detect_nics, nics_to_env_var
from ringtrain.shim import SHIM_DIR


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module.cluster, "node_addresses",
                        lambda: {"nodeA": "10.0.0.1", "nodeB": "10.0.0.2"})
    monkeypatch.setattr(coordinator_module.cluster, "store_host", lambda ips: "127.0.0.1")


def registered(order: list[tuple[str, str]]) -> Coordinator:
    made = Coordinator(SimpleNamespace(timeout_s=45, nics=None))
    for rank, (host, node) in enumerate(order):
        made.register(host, node, rank)
    return made


def test_registration_gives_each_rank_its_place_as_ray_numbered_it() -> None:
    # Ray Train numbered B's worker first: ranks stay, node A (two workers) is node 0 of the cross ranks
    made = registered([("hostB", "nodeB"), ("hostA", "nodeA"), ("hostA", "nodeA")])
    assert made.hostnames == {"hostA", "hostB"}
    assert made.world_size == 3
    assert made.node_id_string == "nodeB:1,nodeA:2"
    info = made.finalize_registration()
    assert sorted(info) == [0, 1, 2]
    places = [(e["HOROVOD_RANK"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"], e["HOROVOD_CROSS_RANK"],
               e["HOROVOD_CROSS_SIZE"], e["HOROVOD_HOSTNAME"]) for e in (info[r] for r in range(3))]
    assert places == [("0", "0", "1", "1", "2", "hostB"), ("1", "0", "2", "0", "2", "hostA"),
                      ("2", "1", "2", "0", "1", "hostA")]
    assert (info[2]["RANK"], info[2]["WORLD_SIZE"], info[2]["LOCAL_RANK"]) == ("2", "3", "1")
    assert not any("MASTER_ADDR" in e or "RINGTRAIN_JOB_SECRET" in e for e in info.values())


def test_the_rendezvous_is_a_job_store_the_ranks_join_with_the_secret(no_cluster: None) -> None:
    made = registered([("hostA", "nodeA"), ("hostB", "nodeB")])
    info = made.finalize_registration()
    common = made.establish_rendezvous()
    try:
        address, secret = common["RINGTRAIN_JOB_STORE"], common["RINGTRAIN_JOB_SECRET"]
        assert address.startswith("127.0.0.1:")
        assert common["MASTER_ADDR"] == "127.0.0.1"
        assert common["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
        store = job_store.JobStore(address, secret, timeout=10.0)
        store.set("k", "v")
        assert store.get("k") == b"v"
        # what hvd.init() reads in rank 1: Ray's own variables, then the Coordinator's two sets
        env = {"HOROVOD_HOSTNAME": "nodeB", "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", **info[1], **common}
        found = detect_environment(env)
        assert (found.name, found.global_rank(), found.world_size()) == ("horovod", 1, 2)
        assert found.hostname() == "hostB"
        assert (found.main_address(), found.main_port()) == job_store.split_address(address)
    finally:
        made.close()
    with pytest.raises(Exception):
        job_store.JobStore(address, secret, timeout=2.0).get("k")


def test_bad_registrations_are_named() -> None:
    made = registered([("hostA", "nodeA")])
    with pytest.raises(ValueError, match="registered twice"):
        made.register("hostB", "nodeB", 0)
    made.register("hostB", "nodeB", 2)
    with pytest.raises(ValueError, match=r"missing: \[1\]"):
        made.finalize_registration()
    with pytest.raises(RuntimeError, match="finalize_registration"):
        Coordinator(SimpleNamespace(timeout_s=5)).establish_rendezvous()


def test_nics_become_gloos_interface_and_none_probes_nothing() -> None:
    assert detect_nics(SimpleNamespace(nics=None), ["h"], []) is None
    assert detect_nics(SimpleNamespace(nics={"eth1", "eth0"})) == {"eth0", "eth1"}
    assert nics_to_env_var({"eth1", "eth0"}) == {"GLOO_SOCKET_IFNAME": "eth0,eth1"}
    assert nics_to_env_var(None) == {}
    with pytest.raises(ValueError, match="network interfaces"):
        detect_nics(SimpleNamespace(nics=["", "eth0"]))


def test_the_shim_has_what_ray_train_imports() -> None:
    # Ray 2.60's ray/train/horovod/config.py imports exactly these; a fresh interpreter with the shim
    code = ("from horovod.ray.runner import Coordinator\n"
            "from horovod.ray.utils import detect_nics, nics_to_env_var\n"
            "from horovod.runner.common.util import secret, timeout\n"
            "import base64\n"
            "key = secret.make_secret_key(); assert len(base64.b64decode(key)) == 32, key\n"
            "t = timeout.Timeout(0, message='waiting for {activity}')\n"
            "try:\n    t.check_time_out_for('the workers')\n"
            "except timeout.TimeoutException as e:\n    print(e)\n"
            "print(Coordinator.__module__)\n")
    path = os.pathsep.join(p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["waiting for the workers", "ringtrain.ray.coordinator"]
