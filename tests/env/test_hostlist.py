"""Slurm host lists and task counts in every format Slurm writes."""

from __future__ import annotations

import pytest

from ringtrain.env.base import EnvironmentError_
from ringtrain.env.slurm import expand_nodelist, parse_tasks_per_node


@pytest.mark.parametrize(("text", "hosts"), [
    ("node01", ["node01"]),
    ("node1,node2", ["node1", "node2"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("a[1-2],b[5,7],c", ["a1", "a2", "b5", "b7", "c"]),
    ("gpu-node-[1-2]", ["gpu-node-1", "gpu-node-2"]),
    ("my-cluster-gpu-a[1,3]", ["my-cluster-gpu-a1", "my-cluster-gpu-a3"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("node[1-2].cluster.org", ["node1.cluster.org", "node2.cluster.org"]),
    ("n[3]", ["n3"]),
    (" node1 , node2 ", ["node1", "node2"]),
])
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-2", "node1-2]", "node[a-b]", "node[5-3]", "node[1-]"])
def test_expand_nodelist_rejects_malformed_lists_with_a_hint(text: str) -> None:
    with pytest.raises(EnvironmentError_, match="HINT") as info:
        expand_nodelist(text)
    assert text in str(info.value)


@pytest.mark.parametrize(("text", "counts"), [
    ("4", [4]),
    ("4(x2)", [4, 4]),
    ("4(x2),2", [4, 4, 2]),
    ("1,2(x3),1", [1, 2, 2, 2, 1]),
])
def test_parse_tasks_per_node(text: str, counts: list[int]) -> None:
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["4(2)", "x", "4(x)", ""])
def test_parse_tasks_per_node_rejects_garbage(text: str) -> None:
    with pytest.raises(EnvironmentError_, match="HINT"):
        parse_tasks_per_node(text)
