"""Mistakes on the command line: the subcommand's usage, a guess at the flag that was meant, exit 2."""

from __future__ import annotations

import pytest

from ringtrain.cli.main import main
from ringtrain.cli.usage import did_you_mean


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["train", "mnist", "--batch-sise", "32"], "usage: ringtrain train", "did you mean --batch-size?"),
    (["train", "mnist", "--epoch", "2"], "usage: ringtrain train", "did you mean --epochs?"),
    (["run", "--np", "2", "python", "x.py"], "usage: ringtrain run", "did you mean -np?"),
    (["run", "-np", "2", "--verbos", "python", "x.py"], "usage: ringtrain run", "did you mean --verbose?"),
    (["check", "--iteration", "3"], "usage: ringtrain check", "did you mean --iterations?"),
    (["train", "mnsit"], "usage: ringtrain train", "did you mean mnist?"),
    (["trian", "mnist"], "usage: ringtrain ", "did you mean train?"),
])
def test_an_unknown_flag_gets_the_subcommands_usage_and_a_guess(argv, usage, hint, capsys):
    code, err = run_main(argv, capsys)
    assert code == 2
    assert err.startswith(usage)
    assert f"HINT: {hint}" in err
    assert "Traceback" not in err


def test_an_unknown_flag_of_train_does_not_print_the_top_level_usage(capsys):
    code, err = run_main(["train", "mnist", "--bogus-flag"], capsys)
    assert code == 2
    assert "usage: ringtrain [-h] [--version] COMMAND" not in err
    assert "ringtrain train: error: unrecognized arguments: --bogus-flag" in err


def test_train_accepts_snake_case_spellings(capsys):
    # parsed (no "unrecognized arguments"), then refused by the job's own check with its hint
    assert main(["train", "mnist", "--batch_size", "32", "--save_every", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ringtrain train: error: --save-every 0 must be at least 1")


def test_prefixes_of_flags_are_not_taken_for_the_flag(capsys):
    # "--verb" would once have meant --verbose: a prefix must not change meaning when flags are added
    code, err = run_main(["run", "--verb", "python", "x.py"], capsys)
    assert code == 2
    assert "unrecognized arguments: --verb" in err


@pytest.mark.parametrize(("word", "candidates", "expected"), [
    ("--batch_size", ["--batch-size", "--lr"], "--batch-size"),
    ("--np", ["-np", "--num-proc", "--nnodes"], "-np"),
    ("--zzz", ["--batch-size", "--lr"], None),
    ("--lr", ["--lr"], None),
])
def test_did_you_mean(word, candidates, expected):
    assert did_you_mean(word, candidates) == expected
