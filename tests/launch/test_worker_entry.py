"""HOROVOD_* variables derived from the elastic agent's variables."""

from ringtrain.launch.worker_entry import horovod_variables, is_python


def test_single_node_variables():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
           "GROUP_WORLD_SIZE": "1", "RINGTRAIN_NODE_HOSTS": "alpha"}
    got = horovod_variables(env)
    assert got["HOROVOD_RANK"] == "1"
    assert got["HOROVOD_SIZE"] == "2"
    assert got["HOROVOD_LOCAL_RANK"] == "1"
    assert got["HOROVOD_LOCAL_SIZE"] == "2"
    assert (got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == ("0", "1")
    assert got["HOROVOD_HOSTNAME"] == "alpha"
    assert got["HOROVOD_CONTROLLER"] == "gloo"
    assert got["PYTHONUNBUFFERED"] == "1"


def test_uneven_nodes_cross_rank_counts_only_nodes_with_that_local_rank():
    # Nodes with 2, 1 and 2 slots: local rank 1 exists on nodes 0 and 2 only.
    env = {"RANK": "4", "WORLD_SIZE": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
           "GROUP_WORLD_SIZE": "3", "RINGTRAIN_NODE_SLOTS": "2,1,2", "RINGTRAIN_NODE_HOSTS": "a,b,c"}
    got = horovod_variables(env)
    assert (got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == ("1", "2")
    assert got["HOROVOD_HOSTNAME"] == "c"


def test_homogeneous_nodes_without_slot_list():
    env = {"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
           "GROUP_WORLD_SIZE": "3"}
    got = horovod_variables(env)
    assert (got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == ("2", "3")


def test_python_names():
    assert is_python("python")
    assert is_python("python3")
    assert is_python("/usr/bin/python3.11")
    assert not is_python("pythonista")
    assert not is_python("bash")
