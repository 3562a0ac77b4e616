"""PBS: node files, pbsdsh tasks, the job script alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.base import EnvironmentError_
from ringtrain.env.pbs import PbsEnvironment, hosts_from_nodefile, nodefile_lines

#: Torque / PBS Pro node file: one line per slot (select=3:mpiprocs=2, the last chunk with one).
NODEFILE = "n01.cluster\nn01.cluster\nn02.cluster\nn02.cluster\nn03.cluster\n"


@pytest.fixture
def nodefile(tmp_path: Path) -> Path:
    path = tmp_path / "aggregate" / "1234.pbs01"
    path.parent.mkdir()
    path.write_text(NODEFILE)
    return path


@pytest.mark.parametrize(("text", "hosts"), [
    (NODEFILE, [("n01.cluster", 2), ("n02.cluster", 2), ("n03.cluster", 1)]),
    ("a\nb\na\n", [("a", 2), ("b", 1)]),
    ("# comment\n\na slots=4\nb slots=2 max_slots=8\n", [("a", 4), ("b", 2)]),
    ("a:3\nb\n", [("a", 3), ("b", 1)]),
    ("", []),
])
def test_hosts_from_nodefile(tmp_path: Path, text: str, hosts: list[tuple[str, int]]) -> None:
    path = tmp_path / "nodes"
    path.write_text(text)
    assert hosts_from_nodefile(path) == hosts


def test_missing_nodefile_is_named(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentError_, match="nodes-gone.*HINT"):
        hosts_from_nodefile(tmp_path / "nodes-gone")


def test_bad_slot_count_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nodes"
    path.write_text("a slots=0\n")
    with pytest.raises(EnvironmentError_, match="slots='0'.*HINT"):
        nodefile_lines(path)


@pytest.mark.parametrize("line", ["  slots=3", ":4", "max_slots=8 a"])
def test_line_without_a_host_is_named(tmp_path: Path, line: str) -> None:
    path = tmp_path / "hostfile"
    path.write_text(f"a slots=2\n{line}\n")
    with pytest.raises(EnvironmentError_, match=f"hostfile:2: '{line.strip()}' names no host.*HINT"):
        nodefile_lines(path)


def _pbs(nodefile: Path, **extra: str) -> dict[str, str]:
    return {"PBS_JOBID": "1234.pbs01", "PBS_NODEFILE": str(nodefile), "PBS_O_WORKDIR": "/home/u/run",
            "PBS_ENVIRONMENT": "PBS_BATCH", **extra}


@pytest.mark.parametrize(("slot", "rank", "local_rank", "local_size", "node", "host"), [
    (0, 0, 0, 2, 0, "n01.cluster"),
    (1, 1, 1, 2, 0, "n01.cluster"),
    (3, 3, 1, 2, 1, "n02.cluster"),
    (4, 4, 0, 1, 2, "n03.cluster"),
])
def test_pbsdsh_task(nodefile: Path, slot: int, rank: int, local_rank: int, local_size: int, node: int,
                     host: str) -> None:
    env = detect_environment(_pbs(nodefile, PBS_TASKNUM=str(slot + 2), PBS_VNODENUM=str(slot),
                                  PBS_NODENUM=str(node)))
    assert isinstance(env, PbsEnvironment)
    assert env.is_task
    p = env.placement()
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size) == (rank, 5, local_rank, local_size)
    assert (p.node_rank, p.num_nodes, p.hostname) == (node, 3, host)
    assert (p.main_address, p.main_port) == ("n01.cluster", 15000 + 1234)
    assert env.validate() == []


def test_job_script_is_one_process_and_warns(nodefile: Path) -> None:
    # Torque gives the job script itself PBS_TASKNUM=1, PBS_VNODENUM=0.
    env = detect_environment(_pbs(nodefile, PBS_TASKNUM="1", PBS_VNODENUM="0", PBS_NODENUM="0"))
    assert not env.is_task
    assert env.script_without_launcher
    p = env.placement()
    assert (p.environment, p.rank, p.world_size, p.main_address) == ("pbs", 0, 1, "127.0.0.1")
    assert env.hosts() == [("n01.cluster", 2), ("n02.cluster", 2), ("n03.cluster", 1)]
    (warning,) = env.validate()
    assert "5 slots" in warning
    assert "HINT" in warning


def test_job_with_one_slot_does_not_warn(tmp_path: Path) -> None:
    path = tmp_path / "nodes"
    path.write_text("n01\n")
    assert detect_environment(_pbs(path)).validate() == []


def test_task_index_outside_the_nodefile_is_reported(nodefile: Path) -> None:
    env = detect_environment(_pbs(nodefile, PBS_TASKNUM="9", PBS_VNODENUM="7"))
    with pytest.raises(EnvironmentError_, match="PBS_VNODENUM=7"):
        env.global_rank()
    assert any("PBS_VNODENUM=7" in w for w in env.validate())


def test_unreadable_nodefile_is_a_warning(tmp_path: Path) -> None:
    env = detect_environment(_pbs(tmp_path / "gone"))
    assert any("cannot read the node file" in w for w in env.validate())


def test_mpi_launcher_inside_pbs_wins(nodefile: Path) -> None:
    env = detect_environment({**_pbs(nodefile), "PMI_RANK": "3", "PMI_SIZE": "5", "MPI_LOCALRANKID": "1",
                              "MPI_LOCALNRANKS": "2"})
    assert env.name == "mpich"
    assert env.main_address() == "n01.cluster"
    assert env.main_port() == 15000 + 1234
