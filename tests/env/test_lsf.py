"""LSF with jsrun: ranks from JSM_NAMESPACE_*, hosts from the rank file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.base import EnvironmentError_
from ringtrain.env.lsf import LsfEnvironment


@pytest.fixture
def rankfile(tmp_path: Path) -> Path:
    path = tmp_path / "rankfile"
    path.write_text("batch1\n" + "c01\n" * 4 + "c02\n" * 4)  # the launch node first, then slots
    return path


def _lsf(rankfile: Path, **extra: str) -> dict[str, str]:
    return {"LSB_JOBID": "51234", "LSB_DJOB_RANKFILE": str(rankfile), "JSM_NAMESPACE_RANK": "6",
            "JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_LOCAL_RANK": "2", **extra}


def test_values(rankfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "c02.summit.olcf")
    env = detect_environment(_lsf(rankfile))
    assert isinstance(env, LsfEnvironment)
    p = env.placement()
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size) == (6, 8, 2, 4)
    assert (p.node_rank, p.num_nodes, p.main_address, p.main_port) == (1, 2, "c01", 15000 + 1234)
    assert env.validate() == []


def test_host_not_in_the_rankfile_is_reported(rankfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "login5")
    env = LsfEnvironment(_lsf(rankfile))
    with pytest.raises(EnvironmentError_, match="'login5'.*HINT"):
        env.node_rank()
    assert any("login5" in w for w in env.validate())


def test_explicit_local_size_and_master_win(rankfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "c01")
    env = LsfEnvironment(_lsf(rankfile, JSM_NAMESPACE_LOCAL_SIZE="4", MASTER_ADDR="c09", MASTER_PORT="1234"))
    assert (env.local_world_size(), env.main_address(), env.main_port()) == (4, "c09", 1234)


def test_lsf_without_jsrun_is_not_lsf(rankfile: Path) -> None:
    env = {"LSB_JOBID": "51234", "LSB_DJOB_RANKFILE": str(rankfile)}
    assert detect_environment(env).name == "single"
