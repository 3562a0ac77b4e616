"""``ringtrain run``'s ranks are told apart from torchrun's and read the same way."""

from __future__ import annotations

from ringtrain.env import detect_environment

RANK = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29400"}


def test_a_rank_of_ringtrain_run_is_named_so() -> None:
    env = detect_environment({**RANK, "RINGTRAIN_ATTEMPT": "0"})
    p = env.placement()
    assert (p.environment, p.rank, p.world_size, p.local_rank) == ("ringtrain-run", 1, 2, 1)
    assert p.local_world_size == 2
    assert env.source_variables()["RINGTRAIN_ATTEMPT"] == "0"
    assert env.validate() == []


def test_without_the_attempt_it_is_torchrun() -> None:
    assert detect_environment(RANK).name == "torchrun"
