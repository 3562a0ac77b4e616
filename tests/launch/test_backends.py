"""The elastic driver's backends: which one a configuration selects, and what each gives the driver
(no process, no Ray: the driver's use of them is tests/launch/test_elastic_driver.py)."""

from __future__ import annotations

import threading

from ringtrain.engine.auth import ENV_SECRET
from ringtrain.launch import link
from ringtrain.launch.backend import WorkerStart, remote_environment
from ringtrain.launch.backends import select_backend
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.elastic_hosts import FixedHosts, ScriptDiscovery
from ringtrain.launch.elastic_worker import ENV_SECRET_ON_STDIN
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.hosts_backend import HostsBackend
from ringtrain.launch.ray.elastic import RayHosts


def config(**fields) -> LaunchConfig:
    return LaunchConfig(command=("python", "train.py"), min_np=1, max_np=4, **fields)


def test_ray_selects_the_ray_nodes_with_each_ranks_share() -> None:
    chosen = select_backend(config(ray="auto", ray_cpus_per_rank=2.0, ray_gpus_per_rank=1.0), num_proc=2)
    assert isinstance(chosen, RayHosts)
    assert (chosen.cpus_per_rank, chosen.gpus_per_rank) == (2.0, 1.0)
    assert chosen.listens_beyond_loopback()
    assert chosen.beat_interval(20.0) == link.sparse_beat_interval(20.0)


def test_a_discovery_script_wins_over_hosts_and_hosts_over_this_machine(tmp_path) -> None:
    script = tmp_path / "discover.sh"
    found = select_backend(config(host_discovery_script=str(script), hosts=(HostSlots("a", 2),)), 2)
    assert isinstance(found, HostsBackend)
    assert isinstance(found.discovery, ScriptDiscovery)
    assert found.listens_beyond_loopback()  # hosts from anywhere
    listed = select_backend(config(hosts=(HostSlots("a", 2), HostSlots("b", 1))), 2)
    assert isinstance(listed, HostsBackend)
    assert listed.find() == {"a": 2, "b": 1}
    here = select_backend(config(), num_proc=3)
    assert isinstance(here, HostsBackend)
    assert here.find() == {"localhost": 3}
    assert not here.listens_beyond_loopback()  # the job store stays on loopback
    assert here.beat_interval(20.0) == link.beat_interval(20.0)


def test_fixed_hosts_of_this_machine_keep_the_store_on_loopback() -> None:
    here = HostsBackend(FixedHosts({"127.0.0.1": 2, "localhost": 1}, "-H"), config())
    assert not here.listens_beyond_loopback()
    elsewhere = HostsBackend(FixedHosts({"localhost": 1, "node-b.invalid": 1}, "-H"), config())
    assert elsewhere.listens_beyond_loopback()


def test_a_remote_worker_gets_no_secret_and_no_enclosing_launchers_rank() -> None:
    start = WorkerStart(wid="w1", host="b", rank=1, argv=["python"], ours={"HOROVOD_RANK": "1"},
                        environ={"PATH": "/usr/bin", ENV_SECRET: "s3cret", "RANK": "7", "MASTER_PORT": "1",
                                 "TORCHELASTIC_RUN_ID": "x", "HOME": "/root",
                                 "RINGTRAIN_PEER_TIMEOUT_SECONDS": "9"},
                        secret="s3cret", lock=threading.Lock(), silence_limit=20.0, beat_interval=5.0)
    env = remote_environment(start, {"EXTRA": "1"})
    assert env == {"PATH": "/usr/bin", "RINGTRAIN_PEER_TIMEOUT_SECONDS": "9", "HOROVOD_RANK": "1",
                   ENV_SECRET_ON_STDIN: "1", "EXTRA": "1"}
