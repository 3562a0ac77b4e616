"""The tutorials' launcher lines on ringtrain, and the remaining flags of mpirun/horovodrun and torchrun.

Each flag is checked for what it does to the ranks (a variable they see, a file they write, what the
console shows), not only for being accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.cli.main import main
from ringtrain.cli.run import add_run_arguments, config_from_args
from ringtrain.launch import aliases
from ringtrain.launch.plan import NodePlan, resolve_plan
from tests.ranks import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "launch" / "scripts"
REPORT_ENV = str(SCRIPTS / "report_env.py")
MNIST = ROOT / ".." / "shared" / "data" / "mnist"


def parse(argv, environ=None):
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, environ=environ or {})
    return config_from_args(parser.parse_args(argv))


def read_ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def user_env(bin_dir: Path | None = None) -> dict[str, str]:
    """This environment as a user's shell would have it: the venv's bin (and ``bin_dir``) first on PATH."""
    path = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    if bin_dir is not None:
        path.insert(0, str(bin_dir))
    return {**os.environ, "PATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


# --- the tutorials' lines ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not (MNIST / "train-images-idx3-ubyte.gz").is_file(), reason=f"real MNIST not in {MNIST}")
def test_horovodrun_line_verbatim_after_install_aliases(tmp_path, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert main(["install-aliases", "--dir", str(bin_dir)]) == 0
    assert f"horovodrun: written {bin_dir / 'horovodrun'}" in capsys.readouterr().out
    line = "horovodrun -np 2 python examples/horovod_mnist.py --data-dir ../shared/data/mnist --epochs 1 " \
           "--train-samples 2000 --log-interval 10"
    result = subprocess.run(shlex.split(line), cwd=ROOT, env=user_env(bin_dir), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    # 2000 images over 2 ranks: each rank's sampler holds 1000, so both ranks took part.
    assert "[0] Train Epoch: 1 [0/1000 (0%)]" in result.stdout, result.stdout
    assert "Test set: Average loss" in result.stdout, result.stdout


@pytest.mark.slow
def test_torchrun_line_verbatim_with_ringtrain_run(tmp_path):
    # The documented step for torchrun lines: the first word `torchrun` becomes `ringtrain run`.
    line = f"ringtrain run --standalone --nproc_per_node=2 examples/ddp_trainer.py 1 1 --subset 400 " \
           f"--snapshot-dir {tmp_path / 'snaps'}"
    result = subprocess.run(shlex.split(line), cwd=ROOT, env=user_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rank(s), strategy ddp" in result.stdout, result.stdout
    assert len(list((tmp_path / "snaps").glob("*.pt"))) == 1


def test_standalone_is_this_node_alone_even_inside_an_allocation():
    plan = resolve_plan(parse(["--standalone", "--nproc_per_node=3", "train.py"]),
                        {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2"})
    assert isinstance(plan, NodePlan)
    assert (plan.nproc, plan.max_nodes, plan.local_only) == (3, 1, True)


# --- install-aliases ---------------------------------------------------------------------------------

def test_aliases_never_replace_a_file_they_did_not_write(tmp_path, capsys):
    foreign = tmp_path / "horovodrun"
    foreign.write_text("#!/bin/sh\necho real horovod\n")
    assert main(["install-aliases", "--dir", str(tmp_path)]) == 2
    assert "is not a ringtrain alias" in capsys.readouterr().err
    assert main(["install-aliases", "--dir", str(tmp_path), "--remove"]) == 0
    assert foreign.read_text() == "#!/bin/sh\necho real horovod\n"


@pytest.mark.slow
def test_alias_runs_ringtrain_run_with_the_arguments_unchanged(tmp_path):
    (result,) = aliases.install(tmp_path)
    assert result.path.stat().st_mode & stat.S_IXUSR
    odd = "a b $HOME 'q'"
    out = subprocess.run([str(result.path), "-np", "1", sys.executable, REPORT_ENV, str(tmp_path), odd],
                         env=user_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert read_ranks(tmp_path)[0]["argv"] == [str(tmp_path), odd]
    (removed,) = aliases.remove(tmp_path)
    assert removed.action == "removed"
    assert not result.path.exists()


def test_aliases_stay_out_where_real_horovod_is_importable(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(aliases, "real_horovod_importable", lambda: True)
    assert main(["install-aliases", "--dir", str(tmp_path)]) == 2
    assert "a real Horovod is installed" in capsys.readouterr().err
    assert not (tmp_path / "horovodrun").exists()


# --- -x NAME[=VALUE] ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_x_sets_and_passes_on_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("RT_FROM_LAUNCHER", "launcher value")
    monkeypatch.setenv("RT_OVERRIDDEN", "old")
    code = main(["run", "-np", "2", "-x", "RT_GIVEN=1", "-x", "RT_FROM_LAUNCHER", "-x", "RT_OVERRIDDEN=new",
                 "--export", "RT_LONG=2", sys.executable, "-c",
                 "import json, os, sys; "
                 "names = ['RT_GIVEN', 'RT_FROM_LAUNCHER', 'RT_OVERRIDDEN', 'RT_LONG']; "
                 "path = os.path.join(sys.argv[1], os.environ['RANK'] + '.json'); "
                 "json.dump({n: os.environ.get(n) for n in names}, open(path, 'w'))",
                 str(tmp_path)])
    assert code == 0
    ranks = read_ranks(tmp_path)
    assert sorted(ranks) == [0, 1]
    for env in ranks.values():
        assert env == {"RT_GIVEN": "1", "RT_FROM_LAUNCHER": "launcher value", "RT_OVERRIDDEN": "new",
                       "RT_LONG": "2"}


def test_x_values_reach_the_config_but_bare_names_do_not_carry_their_value(monkeypatch):
    monkeypatch.setenv("RT_SECRET", "do-not-show")
    config = parse(["-x", "RT_SECRET", "-x", "A=1=2", "-x", "B=", "python", "x.py"])
    assert dict(config.exports) == {"RT_SECRET": None, "A": "1=2", "B": ""}
    assert "do-not-show" not in config.to_json()  # the JSON that agents get is visible in ps


def test_x_from_the_environment_variable():
    config = parse(["python", "x.py"], {"RINGTRAIN_EXPORT": "A=1 B"})
    assert dict(config.exports) == {"A": "1", "B": None}
    assert dict(parse(["-x", "C=3", "python", "x.py"], {"RINGTRAIN_EXPORT": "A=1"}).exports) == {"C": "3"}


def test_x_of_an_unset_variable_exits_2_before_any_rank_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RT_NOT_SET", raising=False)
    assert main(["run", "-np", "1", "-x", "RT_NOT_SET", sys.executable, REPORT_ENV, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "-x RT_NOT_SET: RT_NOT_SET is not set" in err
    assert "HINT: export RT_NOT_SET=" in err
    assert read_ranks(tmp_path) == {}


# --- -m, --no-python, --run-path --------------------------------------------------------------------

PROBE = ("import json, os, sys\n"
         "out = sys.argv[1]\n"
         "json.dump({'name': __name__, 'argv0': sys.argv[0], 'args': sys.argv[1:]},\n"
         "          open(os.path.join(out, os.environ['RANK'] + '.json'), 'w'))\n")


@pytest.mark.slow
def test_m_runs_a_module_on_every_rank(tmp_path, monkeypatch):
    (tmp_path / "rt_probe_module.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-np", "2", "-m", "rt_probe_module", str(out), "--lr", "1"]) == 0
    ranks = read_ranks(out)
    assert sorted(ranks) == [0, 1]
    for seen in ranks.values():
        assert seen["name"] == "__main__"
        assert seen["argv0"].endswith("rt_probe_module.py")
        assert seen["args"] == [str(out), "--lr", "1"]


@pytest.mark.slow
def test_no_python_executes_the_command_itself(tmp_path, capsys):
    tool = tmp_path / "tool.py"  # a .py name, but a shell script: only --no-python runs it right
    tool.write_text('#!/bin/sh\necho "shell rank $RANK" > "$1/$RANK.txt"\n')
    tool.chmod(0o755)
    assert main(["run", "-np", "2", "--no-python", str(tool), str(tmp_path)]) == 0
    assert sorted(p.read_text() for p in tmp_path.glob("*.txt")) == ["shell rank 0\n", "shell rank 1\n"]
    for p in tmp_path.glob("*.txt"):
        p.unlink()
    assert main(["run", "-np", "1", str(tool), str(tmp_path)]) == 1  # through Python: a SyntaxError
    assert "SyntaxError" in capsys.readouterr().err
    assert list(tmp_path.glob("*.txt")) == []


def test_no_python_refuses_a_file_that_cannot_be_executed(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert main(["run", "-np", "1", "--no-python", str(script)]) == 2
    assert "is not an executable on PATH" in capsys.readouterr().err


@pytest.mark.slow
def test_run_path_runs_any_file_as_python(tmp_path, capsys):
    script = tmp_path / "train"  # no .py, not executable: only --run-path can start it
    script.write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["run", "-np", "1", str(script), str(out)]) == 2
    assert "command not found" in capsys.readouterr().err
    assert main(["run", "-np", "1", "--run-path", "--no-python", str(script), str(out), "x"]) == 0
    assert "--no-python has no effect with --run-path" in capsys.readouterr().err
    assert read_ranks(out)[0] == {"name": "__main__", "argv0": str(script), "args": [str(out), "x"]}


@pytest.mark.parametrize(("argv", "needle"), [
    (["-m", "--no-python", "mod"], "-m and --no-python were both given"),
    (["-m", "--run-path", "mod"], "-m and --run-path were both given"),
    (["-m", "python", "x.py"], "-m takes what to run, not the interpreter"),
])
def test_conflicting_command_flags_exit_2(argv, needle, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "HINT:" in err


# --- --log-dir, --redirects, --tee -------------------------------------------------------------------

BOTH_STREAMS = ("import os, sys; r = os.environ['RANK']; print(f'out of rank {r}', flush=True); "
                "print(f'err of rank {r}', file=sys.stderr, flush=True)")


def _logs(log_dir: Path) -> dict[tuple[int, str], str]:
    """(local rank, stream) -> text of the files under torchrun's layout DIR/<run>_*/attempt_0/<lr>/."""
    found = {}
    for path in log_dir.glob("*/attempt_0/*/std*.log"):
        found[(int(path.parent.name), path.stem)] = path.read_text()
    return found


@pytest.mark.slow
def test_log_dir_keeps_every_rank_output(tmp_path, capsys):
    log_dir = tmp_path / "logs"
    assert main(["run", "-np", "2", "--log-dir", str(log_dir), sys.executable, "-c", BOTH_STREAMS]) == 0
    logs = _logs(log_dir)
    for rank in (0, 1):
        assert logs[(rank, "stdout")] == f"out of rank {rank}\n"
        assert logs[(rank, "stderr")] == f"err of rank {rank}\n"
    captured = capsys.readouterr()
    assert "[1] out of rank 1" in captured.out  # still on the console too


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "out_shown", "err_shown"), [
    ([], True, True),
    (["--redirects", "3"], False, False),
    (["--redirects", "3", "--tee", "1"], True, False),
    (["--redirects", "0:2,1:3"], True, False),  # rank 0: stderr off; rank 1: both off
])
def test_redirects_keep_streams_off_the_console(flags, out_shown, err_shown, tmp_path, capsys):
    argv = ["run", "-np", "2", "--log-dir", str(tmp_path), *flags, sys.executable, "-c", BOTH_STREAMS]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert ("[0] out of rank 0" in captured.out) == out_shown
    assert ("[0] err of rank 0" in captured.err) == err_shown
    if flags[-1:] == ["0:2,1:3"]:
        assert "[1] out of rank 1" not in captured.out
    assert _logs(tmp_path)[(0, "stdout")] == "out of rank 0\n"  # the files always have everything
    assert _logs(tmp_path)[(0, "stderr")] == "err of rank 0\n"


# --- --local-addr, --rdzv-conf ----------------------------------------------------------------------

@pytest.mark.slow
def test_local_addr_is_node_0s_address_for_the_workers_under_c10d(tmp_path):
    chosen = "127.0.0.1"
    assert socket.getfqdn() != chosen  # torch's default: the FQDN; the flag must visibly replace it
    code = main(["run", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nnodes",
                 "1", "--nproc-per-node", "1", "--local-addr", chosen, sys.executable, REPORT_ENV,
                 str(tmp_path)])
    assert code == 0
    assert read_ranks(tmp_path)[0]["MASTER_ADDR"] == chosen


@pytest.mark.slow
def test_rdzv_conf_reaches_the_rendezvous(capsys):
    # Node 1 of 2 with nobody at node 0's address: the rendezvous gives up after the configured timeout.
    port = free_port()
    code = main(["run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                 str(port), "--rdzv-conf", "timeout=2", sys.executable, REPORT_ENV, "."])
    assert code == 1
    assert "within 2 s" in capsys.readouterr().err


def test_rdzv_conf_is_parsed_into_the_config():
    assert dict(parse(["--rdzv-conf", "timeout=60, read_timeout=30", "x"]).rdzv_conf) == {
        "timeout": "60", "read_timeout": "30"}


# --- bad values: exit 2, the value, the fix --------------------------------------------------------

@pytest.mark.parametrize(("argv", "needle"), [
    (["-x", "=5", "python", "x.py"], "-x '=5' names no variable"),
    (["-x", "", "python", "x.py"], "-x '' names no variable"),
    (["-x", "1A=2", "python", "x.py"], "-x '1A=2' names no variable"),
    (["--nnodes", "0", "python", "x.py"], "--nnodes '0' is not N or MIN:MAX"),
    (["--redirects", "4", "python", "x.py"], "--redirects '4' is not N or LOCAL_RANK:N"),
    (["--tee", "0:", "python", "x.py"], "--tee '0:' is not N or LOCAL_RANK:N"),
    (["--rdzv-conf", "timeout", "python", "x.py"], "'timeout' is not KEY=VALUE"),
    (["--rdzv-conf", "rank=1", "python", "x.py"], "HINT: give it as --node-rank 1"),
    (["--rdzv-conf", "timeout=abc", "python", "x.py"], "timeout='abc' is not a whole number of seconds"),
    (["--rdzv-conf", "is_host=maybe", "python", "x.py"], "is_host='maybe' is not true or false"),
    (["-np", "1", "--log-dir", "/dev/null/logs", "python", "-c", "pass"],
     "--log-dir '/dev/null/logs' cannot be created"),
])
def test_bad_values_exit_2_with_the_value_and_the_fix(argv, needle, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "HINT:" in err
    assert "Traceback" not in err


def test_install_aliases_says_how_a_plain_python_horovod_script_runs(tmp_path, capsys):
    assert main(["install-aliases", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "python -m ringtrain.shim train.py" in out
    assert "No module named 'horovod'" in out
    assert main(["install-aliases", "--dir", str(tmp_path), "--remove"]) == 0
    assert "ringtrain.shim" not in capsys.readouterr().out
