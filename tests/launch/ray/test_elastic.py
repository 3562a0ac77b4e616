"""``ringtrain run --ray --min-np``'s hosts: the Ray discovery, on node listings made here.

A cluster too small for --min-np is in tests/launch/ray/test_driver.py (its local cluster); the node-loss
run (one worker per Ray node, hostB's node killed, the job going on on hostA with every
sample seen once) is in tests/integration/test_ray_two_hosts.py.
"""

from __future__ import annotations

import types

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.launch.ray.elastic import RayHosts  # noqa: E402 - after the skip: the module needs ray


def node(node_id: str, address: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": address,
            "NodeManagerHostname": "h-" + node_id, "Resources": resources}


def test_the_living_nodes_are_the_hosts_with_as_many_slots_as_their_cpus_hold(monkeypatch):
    listing = [node("a", "10.0.0.1", CPU=4.0), node("b", "10.0.0.2", alive=False, CPU=4.0),
               node("c", "10.0.0.3", CPU=1.0), node("d", "10.0.0.4", CPU=0.9, GPU=1.0)]
    monkeypatch.setattr(ray, "nodes", lambda: listing)
    assert RayHosts(1, 0, start_timeout=5).find() == {"10.0.0.1": 4, "10.0.0.3": 1}
    assert RayHosts(0.3, 0, start_timeout=5).find() == {"10.0.0.1": 13, "10.0.0.3": 3, "10.0.0.4": 3}
    # with GPUs a rank, a node's GPUs bound its slots too
    assert RayHosts(0.3, 1, start_timeout=5).find() == {"10.0.0.4": 1}


def test_a_node_whose_actor_was_lost_is_left_out_and_its_new_incarnation_used(monkeypatch):
    listing = [node("a", "10.0.0.1", CPU=1.0), node("b", "10.0.0.2", CPU=1.0)]
    monkeypatch.setattr(ray, "nodes", lambda: listing)
    hosts = RayHosts(1, 0, start_timeout=5)
    hosts.find()
    # as RayGroup says it after its actor died: Ray may list the node alive a while longer
    hosts._groups.append(types.SimpleNamespace(node={"node_id": "b"}, lost=RuntimeError("gone")))
    assert hosts.find() == {"10.0.0.1": 1}
    listing.append(node("b2", "10.0.0.2", CPU=1.0))  # the node started again: a new id
    assert hosts.find() == {"10.0.0.1": 1, "10.0.0.2": 1}


def test_a_cluster_that_fails_to_answer_is_a_discovery_error(monkeypatch):
    from ringtrain.launch.elastic_hosts import DiscoveryError

    def broken() -> list:
        raise ConnectionError("GCS went away")

    monkeypatch.setattr(ray, "nodes", broken)
    with pytest.raises(DiscoveryError, match=r"did not answer ray.nodes\(\): ConnectionError: GCS went"):
        RayHosts(1, 0, start_timeout=5).find()


def test_the_drivers_own_node_comes_first(monkeypatch):
    from ringtrain.launch.ray import elastic as ray_elastic

    listing = [node("a", "10.0.0.1", CPU=1.0), node("b", "10.0.0.2", CPU=1.0), node("c", "10.0.0.3", CPU=1.0)]
    monkeypatch.setattr(ray, "nodes", lambda: listing)
    monkeypatch.setattr(ray_elastic, "is_local_host", lambda host: host == "10.0.0.2")
    assert list(RayHosts(1, 0, start_timeout=5).find()) == ["10.0.0.2", "10.0.0.1", "10.0.0.3"]
