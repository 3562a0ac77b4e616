"""Mistakes on the command line: one line with a guess at what was meant and where the usage is, exit 2."""

from __future__ import annotations

import pytest

from ringtrain.cli.main import main
from ringtrain.cli.usage import did_you_mean


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "prog", "hint"), [
    (["train", "mnist", "--batch-sise", "32"], "ringtrain train", "did you mean --batch-size?"),
    (["train", "mnist", "--epoch", "2"], "ringtrain train", "did you mean --epochs?"),
    (["run", "--np", "2", "python", "x.py"], "ringtrain run", "did you mean -np?"),
    (["run", "-np", "2", "--verbos", "python", "x.py"], "ringtrain run", "did you mean --verbose?"),
    (["check", "--iteration", "3"], "ringtrain check", "did you mean --iterations?"),
    (["train", "mnsit"], "ringtrain train", "did you mean mnist?"),
    (["trian", "mnist"], "ringtrain", "did you mean train?"),
    (["train", "mnist", "--batchsize", "3"], "ringtrain train", "did you mean --batch-size?"),
    (["train", "mnist", "--device", "gpu"], "ringtrain train", "did you mean cuda?"),
    (["check", "--device", "gpu"], "ringtrain check", "did you mean cuda?"),
    (["train"], "ringtrain train", "give the workload, one of mnist, fashion-mnist"),
    (["script"], "ringtrain script", "give the SCHEDULER, one of slurm, pbs, lsf"),
])
def test_a_mistake_is_one_line_with_the_hint_and_no_usage(argv, prog, hint, capsys):
    code, err = run_main(argv, capsys)
    assert code == 2
    assert err.startswith(f"{prog}: error: ")
    assert f"HINT: {hint}" in err
    assert f"`{prog} --help` lists the" in err
    assert len(err.splitlines()) == 1, err
    assert "usage:" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["train", "--help"], ["run", "--help"], ["script", "slurm", "--help"],
                                  ["--help"]])
def test_the_usage_comes_on_request(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: ringtrain {' '.join(argv[:-1])}".rstrip())


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
    ("--bogus", ["--qos", "--queue"], None),
])
def test_did_you_mean(word, candidates, expected):
    assert did_you_mean(word, candidates) == expected


def test_a_guess_names_the_dashed_spelling_of_a_flag_with_two(capsys):
    code, err = run_main(["train", "mnist", "--warmup-epoch", "1"], capsys)
    assert code == 2
    assert "did you mean --warmup-epochs?" in err


@pytest.mark.parametrize("choices", ["'cpu', 'cuda'", "cpu, cuda"])  # older and newer argparse
def test_an_invalid_choice_is_read_in_either_quoting(choices, capsys):
    from ringtrain.cli.usage import HelpfulParser

    parser = HelpfulParser(prog="ringtrain train")
    with pytest.raises(SystemExit):
        parser.error(f"argument --device: invalid choice: 'gpu' (choose from {choices})")
    assert "HINT: did you mean cuda?" in capsys.readouterr().err
