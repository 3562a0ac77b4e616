"""The variables of a rank placed by a driver that hosts the job store (engine/rank_env.py)."""

from __future__ import annotations

from ringtrain.engine import auth
from ringtrain.engine.rank_env import rank_variables


def test_torch_and_horovod_names_agree_on_the_place_and_point_at_the_store() -> None:
    env = rank_variables(rank=3, size=4, local_rank=1, local_size=2, node_rank=1, cross_rank=1, cross_size=2,
                         hostname="hostB", store_address="10.0.0.1:4242", gloo_timeout_s=30.0)
    place = ("3", "4", "1", "2")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == place
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"],
            env["HOROVOD_LOCAL_SIZE"]) == place
    assert (env["GROUP_RANK"], env["CROSS_RANK"], env["CROSS_SIZE"]) == ("1", "1", "2")
    cross = (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"], env["HOROVOD_HOSTNAME"])
    assert cross == ("1", "2", "hostB")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env[auth.ENV_ADDRESS]) == ("10.0.0.1", "4242",
                                                                               "10.0.0.1:4242")
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"
    assert "GROUP_WORLD_SIZE" not in env  # the cross size is per local rank: CROSS_SIZE says it
    assert not any("SECRET" in name for name in env)  # the secret travels apart


def test_a_fractional_timeout_is_kept() -> None:
    env = rank_variables(rank=0, size=1, local_rank=0, local_size=1, node_rank=0, cross_rank=0, cross_size=1,
                         hostname="h", store_address="[::1]:5000", gloo_timeout_s=2.5)
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "2.5"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("::1", "5000")
