"""``ringtrain run``: flag parsing (both spellings, env variables), bad input, and real local launches."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringtrain.cli.main import main
from ringtrain.cli.run import add_run_arguments, config_from_args
from ringtrain.shim import SHIM_DIR
from tests.processes import alive, owns_two_or_more_cpus

SCRIPTS = Path(__file__).resolve().parents[1] / "launch" / "scripts"
REPORT_ENV = str(SCRIPTS / "report_env.py")


def parse(argv, environ=None):
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, environ=environ or {})
    return config_from_args(parser.parse_args(argv))


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["-np", "4"], "num_proc", 4),
    (["--num-proc", "4"], "num_proc", 4),
    (["--num_proc", "4"], "num_proc", 4),
    (["-p", "2222"], "ssh_port", 2222),
    (["--ssh_port", "2222"], "ssh_port", 2222),
    (["-i", "/k"], "ssh_identity_file", "/k"),
    (["--start-timeout", "5"], "start_timeout", 5.0),
    (["--output-filename", "out"], "output_filename", "out"),
    (["--verbose"], "verbose", True),
    (["-cb"], "check_build", True),
    (["--nnodes", "1:3"], "nnodes", (1, 3)),
    (["--nnodes", "2"], "nnodes", (2, 2)),
    (["--nproc-per-node", "3"], "nproc_per_node", 3),
    (["--nproc_per_node", "3"], "nproc_per_node", 3),
    (["--nproc-per-node", "cpu"], "nproc_per_node", os.cpu_count()),
    (["--node-rank", "1"], "node_rank", 1),
    (["--node_rank", "1"], "node_rank", 1),
    (["--rdzv-backend", "c10d"], "rdzv_backend", "c10d"),
    (["--rdzv_endpoint", "h:1"], "rdzv_endpoint", "h:1"),
    (["--rdzv-id", "job"], "rdzv_id", "job"),
    (["--standalone"], "standalone", True),
    (["--max-restarts", "2"], "max_restarts", 2),
    (["--master-addr", "h"], "master_addr", "h"),
    (["--master_port", "1234"], "master_port", 1234),
    (["--no-horovod-shim"], "horovod_shim", False),
    (["--network-interfaces", "eth0,eth1"], "network_interfaces", ("eth0", "eth1")),
])
def test_flags(argv, field, value):
    assert getattr(parse([*argv, "python", "x.py"]), field) == value


@pytest.mark.parametrize(("argv", "variable", "value"), [
    (["--fusion-threshold-mb", "32"], "HOROVOD_FUSION_THRESHOLD", str(32 * 1024 * 1024)),
    (["--cycle-time-ms", "2.5"], "HOROVOD_CYCLE_TIME", "2.5"),
    (["--cache-capacity", "0"], "HOROVOD_CACHE_CAPACITY", "0"),
    (["--timeline-filename", "t.json"], "HOROVOD_TIMELINE", "t.json"),
    (["--timeline-mark-cycles"], "HOROVOD_TIMELINE_MARK_CYCLES", "1"),
    (["--no-stall-check"], "HOROVOD_STALL_CHECK_DISABLE", "1"),
    (["--stall-check-warning-time-seconds", "9"], "HOROVOD_STALL_CHECK_TIME_SECONDS", "9"),
    (["--stall-check-shutdown-time-seconds", "9"], "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9"),
    (["--gloo-timeout-seconds", "90"], "HOROVOD_GLOO_TIMEOUT_SECONDS", "90"),
    (["--hierarchical-allreduce"], "HOROVOD_HIERARCHICAL_ALLREDUCE", "1"),
    (["--no-hierarchical-allreduce"], "HOROVOD_HIERARCHICAL_ALLREDUCE", "0"),
    (["--autotune"], "HOROVOD_AUTOTUNE", "1"),
    (["--log-level", "DEBUG"], "HOROVOD_LOG_LEVEL", "DEBUG"),
    (["--network-interfaces", "eth0,eth1"], "GLOO_SOCKET_IFNAME", "eth0,eth1"),
    (["--network-interfaces", "eth0,eth1"], "NCCL_SOCKET_IFNAME", "eth0,eth1"),
    (["--start-timeout", "45"], "HOROVOD_START_TIMEOUT", "45"),
    (["--tcp"], "NCCL_IB_DISABLE", "1"),
    (["--bind-to", "core"], "RINGTRAIN_BIND", "core"),
])
def test_tuning_flags_set_worker_variables(argv, variable, value):
    assert parse([*argv, "python", "x.py"]).worker_env[variable] == value


@pytest.mark.parametrize(("environ", "field", "value"), [
    ({"RINGTRAIN_NPROC_PER_NODE": "3"}, "nproc_per_node", 3),
    ({"RINGTRAIN_NUM_PROC": "2"}, "num_proc", 2),
    ({"RINGTRAIN_VERBOSE": "1"}, "verbose", True),
    ({"RINGTRAIN_NO_HOROVOD_SHIM": "true"}, "horovod_shim", False),
    ({"RINGTRAIN_HOSTS": "a:2"}, "hosts", parse(["-H", "a:2", "x"]).hosts),
    ({"RINGTRAIN_START_TIMEOUT": "7"}, "start_timeout", 7.0),
])
def test_environment_variables_set_flags(environ, field, value):
    assert getattr(parse(["python", "x.py"], environ), field) == value


def test_ray_flags():
    assert parse(["python", "x.py"]).ray is None
    assert parse(["--ray", "-np", "2", "python", "x.py"]).ray == "auto"
    config = parse(["--ray", "10.0.0.1:6379", "--ray-cpus-per-rank", "2", "--ray-gpus-per-rank", "1",
                    "--ray-placement-timeout", "5", "python", "x.py"])
    assert (config.ray, config.ray_cpus_per_rank, config.ray_gpus_per_rank, config.ray_placement_timeout) == \
        ("10.0.0.1:6379", 2.0, 1.0, 5.0)
    assert parse(["python", "x.py"], {"RINGTRAIN_RAY": "ray://head:10001"}).ray == "ray://head:10001"


def test_command_line_wins_over_environment():
    assert parse(["-np", "4", "python", "x.py"], {"RINGTRAIN_NUM_PROC": "2"}).num_proc == 4


def test_command_keeps_its_own_flags():
    command = parse(["-np", "2", "python", "x.py", "-np", "--lr", "1"]).command
    assert command == ("python", "x.py", "-np", "--lr", "1")


def run_cli(argv, capsys):
    code = main(["run", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--bogus-flag", "python", "x.py"], "unrecognized arguments"),
    (["-np", "0", "python", "x.py"], "-np 0 must be at least 1"),
    (["--cycle-time-ms", "-1", "python", "x.py"], "must be >= 0"),
    (["-np", "5", "-H", "localhost:2", "python", "x.py"], "more processes than the 2 slots"),
    (["-H", "localhost", "python", "x.py"], "not of the form host:slots"),
    (["-H", "localhost:1,,localhost:1", "python", "x.py"], "has an empty entry"),
    (["--hostfile", "/nonexistent/ringtrain-hosts", "python", "x.py"], "does not exist"),
    (["-np", "1", "ringtrain-no-such-command-xyz"], "command not found"),
    (["-np", "1", "python", "no_such_script_xyz.py"], "script not found"),
    (["-np", "1"], "no command to run"),
    (["-np", "2", "--ray", "python", "x.py"], "--ray 'python' is not a Ray address"),
    (["--ray", "-np", "2", "-H", "a:1,b:1", "python", "x.py"], "--ray cannot be combined with -H"),
    (["--ray", "-np", "2", "--min-np", "1", "--host-discovery-script", "./d.sh", "python", "x.py"],
     "an elastic job on Ray finds its hosts in the cluster's nodes"),
    (["--ray", "-np", "2", "--min-np", "1", "--nproc-per-node", "2", "python", "x.py"],
     "--nproc-per-node cannot be combined with elastic mode"),
    (["--ray", "-np", "2", "--ray-cpus-per-rank", "0", "python", "x.py"], "--ray-cpus-per-rank 0.0 must be"),
])
def test_bad_input_exits_2_with_a_message(argv, needle, capsys):
    try:
        code, err = run_cli(argv, capsys)
    except SystemExit as exc:  # argparse errors
        code, err = exc.code, capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--gloo-timeout-seconds", "0"],
     "--gloo-timeout-seconds 0 sets HOROVOD_GLOO_TIMEOUT_SECONDS='0', which is out of range: it is in "
     "seconds and must be > 0"),
    (["--stall-check-warning-time-seconds", "0"],
     "HOROVOD_STALL_CHECK_TIME_SECONDS='0', which is out of range"),
    (["--bind-to", "socket"], "--bind-to socket sets RINGTRAIN_BIND='socket'"),
])
def test_tuning_flags_are_judged_by_the_workers_rules(argv, needle, capsys):
    code, err = run_cli(["-np", "2", *argv, "python", "-c", "pass"], capsys)
    assert code == 2
    assert needle in err
    assert f"HINT: leave {argv[0]} out for the default" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("variable", "value", "unit"), [
    ("HOROVOD_CYCLE_TIME", "-5", "milliseconds"),
    ("HOROVOD_GLOO_TIMEOUT_SECONDS", "0", "seconds"),
    ("RINGTRAIN_ROUND_TIMEOUT_SECONDS", "0", "seconds"),
    ("RINGTRAIN_PEER_TIMEOUT_SECONDS", "soon", "seconds"),
    ("HOROVOD_FUSION_THRESHOLD", "1.5", "bytes"),
])
def test_bad_worker_variables_are_refused_before_any_rank_starts(variable, value, unit, monkeypatch, capsys):
    monkeypatch.setenv(variable, value)
    code, err = run_cli(["-np", "2", "python", "-c", "raise SystemExit(9)"], capsys)
    assert code == 2
    assert f"{variable}={value!r}" in err
    assert unit in err
    assert "none was started" in err
    assert "HINT:" in err


def test_malformed_hostfile_exits_2(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=two\n")
    code, err = run_cli(["--hostfile", str(hostfile), "python", "x.py"], capsys)
    assert code == 2
    assert "line 1" in err


def test_unreachable_host_exits_2_within_start_timeout(capsys):
    code, err = run_cli(["-H", "localhost:1,ringtrain-unreachable.invalid:1", "--start-timeout", "5",
                         sys.executable, REPORT_ENV, "."], capsys)
    assert code == 2
    assert "host ringtrain-unreachable.invalid unreachable over ssh within 5 s" in err


def test_master_port_in_use_exits_2(capsys):
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, err = run_cli(["-np", "1", "--master-port", str(port), sys.executable, REPORT_ENV, "."], capsys)
    assert code == 2
    assert f"master port {port} is already in use" in err


def test_check_build(capsys):
    assert main(["run", "-cb"]) == 0
    assert "[X] Gloo" in capsys.readouterr().out


ODD_ARGUMENT = "cost $$5 ${local_rank} $HOME 'q' \"dq\""


def read_ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_local_ranks_get_torch_and_horovod_variables(nproc, tmp_path, capsys):
    argv = ["-np", str(nproc), "python", REPORT_ENV, str(tmp_path)]
    if nproc == 1:  # arguments reach the program unchanged, "$" included
        argv.append(ODD_ARGUMENT)
    if nproc == 2:
        argv = ["--nproc-per-node", "2", "--output-filename", str(tmp_path / "logs"), "python", REPORT_ENV,
                str(tmp_path)]
    assert main(["run", *argv]) == 0
    ranks = read_ranks(tmp_path)
    assert sorted(ranks) == list(range(nproc))
    for rank, env in ranks.items():
        assert env["RANK"] == env["HOROVOD_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["HOROVOD_SIZE"] == str(nproc)
        assert env["LOCAL_RANK"] == env["HOROVOD_LOCAL_RANK"] == str(rank)
        assert env["HOROVOD_LOCAL_SIZE"] == str(nproc)
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("0", "1")
        assert env["HOROVOD_CONTROLLER"] == "gloo"
        assert env["PYTHONUNBUFFERED"] == "1"
    if nproc == 1:
        assert ranks[0]["argv"] == [str(tmp_path), ODD_ARGUMENT]
    out = capsys.readouterr().out
    assert "[0] hello from rank 0" in out
    if nproc == 2:
        for rank in range(2):
            assert (tmp_path / "logs" / f"rank.{rank}" / "stdout").read_text() == f"hello from rank {rank}\n"


@pytest.mark.slow
def test_failing_rank_is_reported_once_as_root_cause(tmp_path, capsys):
    code = main(["run", "-np", "2", REPORT_ENV, str(tmp_path), "fail"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("Root cause") == 1
    assert "rank       : 1" in err
    assert "exit code 1" in err
    assert "ValueError: rank one gives up" in err


@pytest.mark.slow
def test_a_failed_ranks_traceback_appears_once(tmp_path, capsys):
    # once in the rank's own output (relayed) and once in the report, it was shown twice
    code = main(["run", "-np", "2", REPORT_ENV, str(tmp_path), "fail"])
    captured = capsys.readouterr()
    both = captured.out + captured.err
    assert code == 1
    assert both.count('raise ValueError("rank one gives up")') == 1
    assert both.count("Traceback (most recent call last)") == 1
    # the rank's own output still says where it failed, in one line
    assert "[1] ValueError: rank one gives up (traceback in the launcher's failure report)" in captured.err


@pytest.mark.slow
def test_hosts_as_separate_nodes_on_this_machine(tmp_path, capsys):
    # Two "hosts" that are both this machine: one agent each, joined by the static rendezvous.
    code = main(["run", "-H", "localhost:2,127.0.0.1:1", sys.executable, REPORT_ENV, str(tmp_path), "fail"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("Root cause") == 1
    assert "rank       : 1 of 3" in err
    ranks = read_ranks(tmp_path)
    assert sorted(ranks) == [0, 1, 2]
    assert [(ranks[r]["HOROVOD_HOSTNAME"], ranks[r]["HOROVOD_LOCAL_RANK"], ranks[r]["HOROVOD_CROSS_RANK"],
             ranks[r]["HOROVOD_CROSS_SIZE"]) for r in range(3)] == [
        ("localhost", "0", "0", "2"), ("localhost", "1", "0", "1"), ("127.0.0.1", "0", "1", "2")]


@pytest.mark.slow
@pytest.mark.parametrize(("hosts", "sig"), [
    (None, signal.SIGTERM), ("localhost:1,127.0.0.1:1", signal.SIGTERM), (None, signal.SIGKILL),
    ("localhost:1,127.0.0.1:1", signal.SIGKILL)])
def test_stopping_the_launcher_leaves_no_process(hosts, sig, tmp_path):
    """SIGTERM: the agent stops its ranks. SIGKILL: the ranks see their agent die and stop too."""
    argv = ["-np", "2"] if hosts is None else ["-H", hosts]
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain", "run", *argv, sys.executable, REPORT_ENV,
                             str(tmp_path), "sleep"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(read_ranks(tmp_path)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    pids = [env["pid"] for env in read_ranks(tmp_path).values()]
    assert len(pids) == 2, proc.stderr.read().decode() if proc.poll() is not None else "ranks did not start"
    proc.send_signal(sig)
    assert proc.wait(timeout=90) != 0
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.slow
@pytest.mark.skipif(not (SHIM_DIR / "horovod").is_dir(), reason="the horovod shim package is not there yet")
def test_unmodified_horovod_script_runs_through_the_shim(tmp_path, capsys):
    # in this process, as the other launches here: a `ringtrain run` of its own would import torch again
    code = main(["run", "-np", "2", "python", str(SCRIPTS / "hvd_shim.py"), str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    lines = sorted(p.read_text() for p in tmp_path.glob("*.txt"))
    assert lines == ["0 2 0 3.0", "1 2 1 3.0"]


def test_flags_without_effect_are_accepted_with_a_warning():
    config = parse(["--mpi", "--hierarchical-allreduce", "--torus-allreduce", "python", "x.py"])
    assert any(note.startswith("--mpi: ringtrain has no MPI mode") and "mpirun -np N" in note
               for note in config.notes)
    assert any("--torus-allreduce accepted" in note for note in config.notes)
    # hierarchical allreduce is implemented: no warning
    assert not any("hierarchical" in note for note in config.notes)
    assert parse(["--gloo", "python", "x.py"]).notes == ()


def test_autotune_flags_warn_once_and_share_one_help_entry():
    config = parse(["--autotune", "--autotune-warmup-samples", "3", "--autotune-log-file", "t.csv",
                    "python", "x.py"])
    autotune = [note for note in config.notes if "autotune" in note]
    assert autotune == ["--autotune, --autotune-log-file, --autotune-warmup-samples: accepted and ignored; "
                        "ringtrain does not autotune. Set --fusion-threshold-mb, --cycle-time-ms or "
                        "RINGTRAIN_BUCKET_CAP_MB yourself (docs/horovod-conformance.md)."]
    assert config.worker_env["HOROVOD_AUTOTUNE"] == "1"  # still passed on, as horovodrun does
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, environ={})
    shown = [a for a in parser._actions if any(o.startswith("--autotune") for o in a.option_strings)
             and a.help != argparse.SUPPRESS]
    assert [a.option_strings[0] for a in shown] == ["--autotune"]
    for flag in ("--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
                 "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise"):
        assert flag in shown[0].help


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["-np", "2", "--min-np", "1"], "min_np", 1),
    (["-np", "2", "--min-num-proc", "1"], "min_np", 1),
    (["-np", "2", "--max-np", "4"], "max_np", 4),
    (["-np", "2", "--max_num_proc", "4"], "max_np", 4),
    (["-np", "2", "--host-discovery-script", "./d.sh"], "host_discovery_script", "./d.sh"),
    (["-np", "2", "--min-np", "1", "--slots-per-host", "4"], "slots_per_host", 4),
    (["-np", "2", "--min-np", "1", "--slots", "4"], "slots_per_host", 4),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "30"], "elastic_timeout", 30.0),
    (["-np", "2", "--min-np", "1", "--reset-limit", "3"], "reset_limit", 3),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "10", "100"], "cooldown_range", (10, 100)),
    (["--min-np", "3"], "num_proc", 3),  # -np defaults to --min-np, as horovodrun's min defaults to -np
])
def test_elastic_flags(argv, field, value):
    config = parse([*argv, "python", "x.py"])
    assert getattr(config, field) == value
    assert config.elastic


def test_elastic_flags_from_the_environment():
    config = parse(["python", "x.py"], {"RINGTRAIN_MIN_NP": "1", "RINGTRAIN_NUM_PROC": "2",
                                        "RINGTRAIN_COOLDOWN_RANGE": "5 50"})
    assert (config.elastic, config.min_np, config.num_proc, config.cooldown_range) == (True, 1, 2, (5, 50))


def test_without_elastic_flags_the_job_is_not_elastic_and_elastic_only_flags_warn():
    assert not parse(["-np", "2", "python", "x.py"]).elastic
    config = parse(["-np", "2", "--reset-limit", "2", "python", "x.py"])
    assert not config.elastic
    assert any("--reset-limit has no effect without --min-np" in note for note in config.notes)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--host-discovery-script", "d.sh", "python", "x.py"], "elastic mode needs -np"),
    (["-np", "2", "--min-np", "3", "python", "x.py"], "-np 2 lies outside --min-np 3"),
    (["-np", "2", "--min-np", "1", "--max-np", "1", "python", "x.py"], "-np 2 lies outside"),
    (["-np", "2", "--min-np", "3", "--max-np", "2", "python", "x.py"], "--max-np 2 is below --min-np 3"),
    (["-np", "2", "--min-np", "0", "python", "x.py"], "must be >= 1"),
    (["-np", "2", "-H", "a:2", "--host-discovery-script", "d.sh", "python", "x.py"], "were both given"),
    (["-np", "2", "--min-np", "1", "--max-restarts", "2", "python", "x.py"],
     "--max-restarts cannot be combined"),
    (["-np", "2", "--min-np", "1", "--nnodes", "2", "python", "x.py"], "--nnodes cannot be combined"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "0", "10", "python", "x.py"],
     "--blacklist-cooldown-range 0 10 is not a range"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "20", "10", "python", "x.py"], "MIN <= MAX"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "1", "9999", "python", "x.py"], "3600"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "a", "10", "python", "x.py"], "two whole"),
])
def test_bad_elastic_input_exits_2_with_a_message(argv, needle, capsys):
    try:
        code, err = run_cli(argv, capsys)
    except SystemExit as exc:  # argparse errors
        code, err = exc.code, capsys.readouterr().err
    assert code == 2
    assert needle in err


@pytest.mark.slow
def test_options_of_the_command_are_not_taken_for_abbreviations_of_ours(capsys):
    # --out, --log, --verb are prefixes of --output-filename, --log-level, --verbose
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_run_arguments(parser, environ={})
    argv = ["-np", "2", "python", "x.py", "--out", "d", "--log", "--verb"]
    config = config_from_args(parser.parse_args(argv))
    assert config.command == ("python", "x.py", "--out", "d", "--log", "--verb")
    assert config.output_filename is None
    # the command line as the CLI gets it, launched in this process (a `ringtrain run` of its own would
    # import torch again)
    code = main(["run", "-np", "1", sys.executable, "-c", "import sys; assert sys.argv[1:] == ['--out', 'x']",
                 "--out", "x"])
    assert code == 0, capsys.readouterr().err


#: The public flags of ``ringtrain run`` (dashed spellings); changing this set is a deliberate act.
PUBLIC_FLAGS = {
    "-np", "--num-proc", "-H", "--hosts", "-hostfile", "--hostfile", "-p", "--ssh-port", "-i",
    "--ssh-identity-file", "--gloo", "--mpi", "--mpi-args", "--binding-args", "--disable-cache",
    "--start-timeout", "--hang-timeout", "--no-watch",
    "--network-interfaces", "--network-interface", "--output-filename", "--verbose",
    "-cb", "--check-build", "--log-level", "--fusion-threshold-mb", "--cycle-time-ms",
    "--cache-capacity", "--hierarchical-allreduce", "--no-hierarchical-allreduce",
    "--hierarchical-allgather", "--no-hierarchical-allgather", "--torus-allreduce",
    "--no-torus-allreduce", "--autotune", "--autotune-log-file", "--autotune-warmup-samples",
    "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples",
    "--autotune-gaussian-process-noise", "--timeline-filename", "--timeline-mark-cycles",
    "--no-stall-check", "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--gloo-timeout-seconds", "--num-nccl-streams", "--bind-to", "--thread-affinity", "--mpi-threads-disable",
    "--log-without-timestamp", "--tcp", "--nnodes", "--nproc-per-node", "--node-rank", "--rdzv-backend",
    "--rdzv-endpoint", "--rdzv-id", "--standalone", "--max-restarts", "--master-addr", "--master-port",
    "--no-horovod-shim", "-x", "--export", "-m", "--module", "--no-python", "--run-path", "--log-dir",
    "--redirects", "--tee", "--local-addr", "--rdzv-conf", "--min-np", "--min-num-proc", "--max-np",
    "--max-num-proc",
    "--host-discovery-script", "--slots-per-host", "--slots", "--elastic-timeout", "--reset-limit",
    "--blacklist-cooldown-range", "--oversubscribe", "--requeue",
    "--ray", "--ray-cpus-per-rank", "--ray-gpus-per-rank", "--ray-placement-timeout",
}
#: Hidden flags of earlier releases, through which a driver configured its agents (now a JSON hop).
FORMER_INTERNAL_FLAGS = {"--node-slots", "--node-hosts", "--failure-marker", "--watch-stdin"}


def test_the_set_of_flags_is_frozen_and_every_long_flag_has_a_snake_case_spelling():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, environ={})
    options = {o for action in parser._actions for o in action.option_strings} - {"-h", "--help"}
    dashed = {o for o in options if "_" not in o}
    assert dashed == PUBLIC_FLAGS
    for flag in PUBLIC_FLAGS:
        if flag.startswith("--") and "-" in flag[2:]:
            assert "--" + flag[2:].replace("-", "_") in options, flag


def test_help_shows_no_internal_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    # argparse wraps help text at hyphens: a flag named in a help text may be split over two lines.
    text = re.sub(r"-\n\s+", "-", capsys.readouterr().out)
    shown = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text)) - {"-h", "--help"}
    assert not shown & FORMER_INTERNAL_FLAGS
    # every flag the help names is public ("--no-<x>" of the on/off tuning flags is not shown at all)
    assert {flag.replace("_", "-") for flag in shown} <= PUBLIC_FLAGS
    assert "--network-interfaces" in shown
    assert "--no-horovod-shim" in shown


def test_a_former_internal_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--node-slots", "1,1", "python", "x.py"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --node-slots" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not owns_two_or_more_cpus(),
                    reason="needs 2 or more CPUs, none of them taken away from this process")
def test_bind_to_core_gives_each_rank_of_any_script_its_own_cores(tmp_path, capsys):
    """A plain script (no hvd.init, no Trainer): the mask is set before it runs, in every thread."""
    script = tmp_path / "mask.py"
    script.write_text("import os, sys\n"
                      "with open(os.path.join(sys.argv[1], os.environ['RANK']), 'w') as fp:\n"
                      "    fp.write(' '.join(map(str, sorted(os.sched_getaffinity(0)))))\n")
    # launched in this process (each rank binds itself, in worker_entry: this process's mask is not touched)
    code = main(["run", "-np", "2", "--bind-to", "core", sys.executable, str(script), str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    masks = [set(map(int, (tmp_path / str(rank)).read_text().split())) for rank in range(2)]
    assert all(masks), masks
    assert not masks[0] & masks[1]
    assert masks[0] | masks[1] <= os.sched_getaffinity(0)


@pytest.fixture
def no_launch(monkeypatch):
    """Record the configs ``ringtrain run`` would launch, and start nothing."""
    import ringtrain.launch.entry as entry

    launched = []
    monkeypatch.setattr(entry, "launch", lambda config: launched.append(config) or 0)
    return launched


BAD_TIMELINE = "/nonexistent/t.json"


@pytest.mark.parametrize(("argv", "environ", "source"), [
    (["-np", "2"], {"HOROVOD_TIMELINE": BAD_TIMELINE}, f"HOROVOD_TIMELINE={BAD_TIMELINE}"),
    (["-np", "2", "--timeline-filename", BAD_TIMELINE], {}, f"--timeline-filename {BAD_TIMELINE}"),
    (["-np", "2", "-x", f"HOROVOD_TIMELINE={BAD_TIMELINE}"], {}, f"-x HOROVOD_TIMELINE={BAD_TIMELINE}"),
])
def test_a_timeline_rank_0_cannot_write_is_refused_before_any_rank(argv, environ, source, monkeypatch,
                                                                  no_launch, capsys):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["run", *argv, "python", "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ringtrain run: error: {source}: rank 0 could not write the timeline: the folder "
                          "/nonexistent does not exist. HINT:")
    assert "Traceback" not in err
    assert no_launch == []


def test_more_ranks_than_cores_warns_once_then_launches(monkeypatch, no_launch, capsys):
    import ringtrain.launch.prechecks as prechecks

    monkeypatch.setattr(prechecks, "usable_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["run", "-np", "3", "python", "-c", "pass"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "ringtrain run: warning: 3 ranks x 1 thread each = 3 threads on 2 cores" in err
    assert "HINT: use -np 2 or fewer; --oversubscribe (RINGTRAIN_OVERSUBSCRIBE=1) silences this" in err
    assert main(["run", "-np", "3", "--oversubscribe", "python", "-c", "pass"]) == 0
    monkeypatch.setenv("RINGTRAIN_OVERSUBSCRIBE", "1")
    assert main(["run", "-np", "3", "python", "-c", "pass"]) == 0
    assert "warning:" not in capsys.readouterr().err
    assert len(no_launch) == 3


def test_hang_timeout_and_no_watch_reach_the_workers_variables():
    config = parse(["--hang-timeout", "45", "python", "x.py"])
    assert config.hang_timeout == 45.0
    assert config.worker_env["RINGTRAIN_HANG_TIMEOUT"] == "45"
    assert "RINGTRAIN_WATCH" not in config.worker_env
    off = parse(["--no-watch", "python", "x.py"])
    assert off.watch is False
    assert off.worker_env["RINGTRAIN_WATCH"] == "0"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_hang_timeout_is_one_line_naming_it_and_exit_2(value, capsys):
    with pytest.raises(SystemExit) as info:
        parse(["--hang-timeout", value, "python", "x.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"'{value}' is not a positive number of seconds. HINT:" in err
    assert "Traceback" not in err
