"""The Ray place in the table of places (its actor: tests/launch/ray/test_actor.py; its driver:
tests/launch/ray/test_driver.py and tests/integration/test_ray_two_hosts.py)."""

from __future__ import annotations

from ringtrain.launch.places import PLACES
from ringtrain.launch.ray.group import RayGroup


def test_the_table_names_the_ray_place():
    assert PLACES["ray"] is RayGroup
