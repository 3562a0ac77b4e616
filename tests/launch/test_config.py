"""``LaunchConfig``: its JSON round trip (the driver-to-agent hop) and the workers' environment it implies."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from ringtrain.launch import config as config_module
from ringtrain.launch.config import DriverLink, LaunchConfig, worker_environment
from ringtrain.launch.hosts import HostSlots
from ringtrain.shim import SHIM_DIR, real_horovod_importable

#: Every field away from its default, so that a field that does not survive JSON fails the round trip.
EVERYTHING = LaunchConfig(
    command=("python", "train.py", "--lr", "$1 'quoted' \"double\""),
    num_proc=6,
    hosts=(HostSlots("node1", 4), HostSlots("node2", 2)),
    ssh_port=2222,
    ssh_identity_file="/keys/id",
    start_timeout=12.5,
    network_interfaces=("eth0", "ib0"),
    output_filename="/out",
    verbose=True,
    check_build=True,
    log_level="DEBUG",
    nnodes=(1, 3),
    nproc_per_node=2,
    node_rank=1,
    rdzv_backend="c10d",
    rdzv_endpoint="node1:29400",
    rdzv_id="job-7",
    standalone=True,
    max_restarts=3,
    hang_timeout=45.0,
    watch=False,
    requeue=True,
    master_addr="node1",
    master_port=29500,
    horovod_shim=False,
    tuning={"HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_FUSION_THRESHOLD": "1048576"},
    exports={"NCCL_DEBUG": "INFO", "WANDB_API_KEY": None},
    no_python=True,
    log_dir="/logs",
    redirects="0:3,1:2",
    tee="1",
    local_addr="10.0.0.7",
    rdzv_conf={"timeout": "60", "read_timeout": "30"},
    driver=DriverLink(node_slots=(4, 2), node_hosts=("node1", "node2")),
    notes=("--mpi accepted",),
    min_np=2,
    max_np=8,
    slots_per_host=4,
    host_discovery_script="./discover.sh --zone a",
    elastic_timeout=30.5,
    reset_limit=5,
    cooldown_range=(10, 300),
    ray="ray://head:10001",
    ray_cpus_per_rank=2.5,
    ray_gpus_per_rank=1.0,
    ray_placement_timeout=7.5,
)


def test_the_sample_sets_every_field():
    defaults = LaunchConfig(command=("x",))
    same = [f.name for f in dataclasses.fields(LaunchConfig)
            if getattr(EVERYTHING, f.name) == getattr(defaults, f.name)]
    assert same == [], f"give these fields a non-default value in EVERYTHING: {same}"


@pytest.mark.parametrize("config", [EVERYTHING, LaunchConfig(command=("python", "x.py"))],
                         ids=["every-field", "defaults"])
def test_json_round_trip(config):
    text = config.to_json()
    assert "\n" not in text  # one argument on any command line
    back = LaunchConfig.from_json(text)
    assert back == config
    assert isinstance(back.hosts, tuple | type(None))
    if config.hosts:
        assert all(isinstance(h, HostSlots) for h in back.hosts)
        assert isinstance(back.driver, DriverLink)
        assert isinstance(back.nnodes, tuple)
        assert isinstance(back.start_timeout, float)


def test_a_whole_number_timeout_comes_back_as_float():
    text = LaunchConfig(command=("x",), start_timeout=30).to_json()
    assert LaunchConfig.from_json(text).start_timeout == 30.0
    assert isinstance(LaunchConfig.from_json(text).start_timeout, float)


def test_an_unknown_field_is_refused_with_a_hint():
    body = json.loads(LaunchConfig(command=("x",)).to_json())
    body["from_a_newer_ringtrain"] = 1
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['from_a_newer_ringtrain'\].*HINT: install"):
        LaunchConfig.from_json(json.dumps(body))


def test_worker_env_from_the_config_alone():
    env = EVERYTHING.worker_env
    assert env == {
        "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_FUSION_THRESHOLD": "1048576",
        "GLOO_SOCKET_IFNAME": "eth0,ib0", "NCCL_SOCKET_IFNAME": "eth0,ib0", "HOROVOD_GLOO_IFACE": "eth0",
        "HOROVOD_LOG_LEVEL": "DEBUG", "HOROVOD_START_TIMEOUT": "12.5",
        "NCCL_DEBUG": "INFO", "RINGTRAIN_WORKER_NO_PYTHON": "1",  # -x with a value, --no-python
        "RINGTRAIN_HANG_TIMEOUT": "45", "RINGTRAIN_WATCH": "0",  # --hang-timeout 45, --no-watch
    }
    assert LaunchConfig(command=("x",)).worker_env == {"HOROVOD_START_TIMEOUT": "30"}


def test_worker_env_is_a_fresh_dict_each_time():
    config = LaunchConfig(command=("x",), tuning={"HOROVOD_CYCLE_TIME": "1"})
    config.worker_env["HOROVOD_CYCLE_TIME"] = "changed"
    assert config.worker_env["HOROVOD_CYCLE_TIME"] == "1"
    assert config.tuning == {"HOROVOD_CYCLE_TIME": "1"}


@pytest.mark.skipif(real_horovod_importable(), reason="a real horovod is installed: the shim stays out")
def test_workers_of_a_single_machine_get_loopback_threads_and_the_shim(monkeypatch):
    monkeypatch.setattr(config_module, "socket_if_names", lambda: [(1, "lo"), (2, "eth0")])
    env = worker_environment(LaunchConfig(command=("x",)), {"PYTHONPATH": "/mine"}, nproc=2, local_only=True)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["PYTHONPATH"] == os.pathsep.join([str(SHIM_DIR), "/mine"])
    assert "RINGTRAIN_NODE_SLOTS" not in env
    assert "RINGTRAIN_NODE_HOSTS" not in env


def test_what_the_user_set_is_left_alone(monkeypatch):
    monkeypatch.setattr(config_module, "socket_if_names", lambda: [(1, "lo")])
    environ = {"OMP_NUM_THREADS": "4", "GLOO_SOCKET_IFNAME": "eth1", "PYTHONPATH": str(SHIM_DIR)}
    env = worker_environment(LaunchConfig(command=("x",)), environ, nproc=2, local_only=True)
    assert "OMP_NUM_THREADS" not in env
    assert "GLOO_SOCKET_IFNAME" not in env
    assert "PYTHONPATH" not in env  # the shim is there already


def test_the_nic_flag_wins_over_loopback_and_no_shim_when_refused(monkeypatch):
    monkeypatch.setattr(config_module, "socket_if_names", lambda: [(1, "lo")])
    config = LaunchConfig(command=("x",), network_interfaces=("eth0",), horovod_shim=False)
    env = worker_environment(config, {}, nproc=1, local_only=True)
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert "OMP_NUM_THREADS" not in env  # one rank may use every core
    assert "PYTHONPATH" not in env


def test_several_hosts_get_no_loopback_and_the_driver_s_node_layout(monkeypatch):
    monkeypatch.setattr(config_module, "socket_if_names", lambda: [(1, "lo")])
    config = LaunchConfig(command=("x",), driver=DriverLink((2, 1), ("hostA", "hostB")))
    env = worker_environment(config, {}, nproc=2, local_only=False)
    assert "GLOO_SOCKET_IFNAME" not in env
    assert env["RINGTRAIN_NODE_SLOTS"] == "2,1"
    assert env["RINGTRAIN_NODE_HOSTS"] == "hostA,hostB"


def test_one_named_host_without_a_driver_gives_its_name():
    env = worker_environment(LaunchConfig(command=("x",)), {}, nproc=1, local_only=True, node_hosts=("n1",))
    assert env["RINGTRAIN_NODE_HOSTS"] == "n1"
    assert "RINGTRAIN_NODE_SLOTS" not in env


def test_table_lists_every_field():
    table = EVERYTHING.table()
    for f in dataclasses.fields(LaunchConfig):
        assert f"  {f.name} " in table
    assert "node1:4,node2:2" in table
    assert "HOROVOD_CYCLE_TIME=2.5 HOROVOD_FUSION_THRESHOLD=1048576" in table


def test_x_variables_reach_the_workers_and_a_bare_name_takes_the_launcher_value():
    config = LaunchConfig(command=("x",), exports={"GIVEN": "1", "FROM_HERE": None})
    env = worker_environment(config, {"FROM_HERE": "here"}, nproc=1, local_only=True)
    assert (env["GIVEN"], env["FROM_HERE"]) == ("1", "here")


def test_no_python_is_told_to_the_workers_under_a_name_that_is_no_flag_variable():
    env = LaunchConfig(command=("x",), no_python=True).worker_env
    assert env[config_module.NO_PYTHON_VARIABLE] == "1"
    assert config_module.NO_PYTHON_VARIABLE != "RINGTRAIN_NO_PYTHON"  # `ringtrain run --no-python`'s own
