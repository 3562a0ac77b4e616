"""The ``ringtrain`` command: its subcommands' public flags are frozen, misuse exits 2 without a traceback."""

from __future__ import annotations

import argparse

import pytest

from ringtrain.cli.main import build_parser, main

#: Options of every scheduler's script; each scheduler adds its own words for where the job goes. Another
#: scheduler's words are hidden options that exit 2 with the right one (``--queue`` on Slurm, ...).
SCRIPT_FLAGS = {"--account", "--cpus-per-proc", "--gpus-per-node", "--job-name", "--nodes",
                "--nproc-per-node", "--output", "--procs-per-node", "--python", "--setup", "--time", "--venv",
                "--mail-user", "--mail-type", "-A", "-J", "-N", "-o", "-t"}

#: Every public flag of each subcommand (``-h``/``--help`` aside); changing one is a deliberate act.
#: ``run`` and ``train`` have theirs in test_run.py and test_train.py; others are not frozen here.
FROZEN: dict[tuple[str, ...], set[str]] = {
    ("check",): {"--device", "--iterations", "--json", "--no-bandwidth", "--sizes", "--timeout"},
    ("env",): {"--json"},
    ("script",): set(),
    ("script", "slurm"): SCRIPT_FLAGS | {"--partition", "-p", "--qos", "-q", "--queue", "--project", "-P"},
    ("script", "pbs"): SCRIPT_FLAGS | {"--queue", "-q", "--pbs-resources", "--partition", "-p", "--qos",
                                       "--project", "-P"},
    ("script", "lsf"): SCRIPT_FLAGS | {"--queue", "-q", "--project", "-P", "--partition", "-p", "--qos"},
    ("install-aliases",): {"--dir", "--remove"},
    ("shim-path",): {"--check"},
}


def subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings} - {"-h", "--help"}


@pytest.mark.parametrize("path", sorted(FROZEN))
def test_subcommand_flags_are_frozen(path):
    assert options(subparser(build_parser(), path)) == FROZEN[path]


def test_top_level_flags():
    assert options(build_parser()) == {"--version"}


def test_no_subcommand_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: ringtrain" in capsys.readouterr().out


def test_a_usage_error_is_one_line_with_exit_2(capsys):
    assert main(["run", "-np", "0", "python", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ringtrain run: error: -np 0 must be at least 1. HINT:")
    assert "Traceback" not in err
