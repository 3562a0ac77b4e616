"""The user docs tell the truth about the code: commands and flags exist, links and anchors resolve,
docs/index.md lists every page honestly, the horovodrun flag table matches ``ringtrain run``, and no
development-diary text is left. Fast: the commands are checked against the real argparse tree, nothing
is started. The checkers live in tests/docs_check.py; each is also shown failing on a planted docs
tree, so that a checker that reports nothing cannot pass for a doc that is right.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from tests import docs_check
from tests.docs_check import Problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    """The real ``ringtrain`` parser, built once for the module."""
    return docs_check.build_parser()


def _report(problems: list[Problem], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(f"  {p}" for p in problems)


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def _lines(problems: list[Problem]) -> list[tuple[str, int]]:
    return [(p.path, p.line) for p in problems]


# --------------------------------------------------------------------------------------------------
# The real docs
# --------------------------------------------------------------------------------------------------

def test_documented_commands_and_flags_exist(parser: argparse.ArgumentParser) -> None:
    """Every ``ringtrain ...`` / ``horovodrun ...`` line of docs/*.md and README.md (fenced shell blocks
    and inline code) names subcommands, choices and flags the parser has; flags after the user's
    program (``python train.py --epochs 1``) or after ``--`` are the program's and are not checked."""
    problems = docs_check.command_problems(ROOT, parser=parser)
    if problems:
        pytest.fail(_report(problems, "documented commands the CLI does not have"), pytrace=False)


def test_links_and_anchors_resolve() -> None:
    """Every relative link of docs/*.md, README.md, CONTRIBUTING.md, benchmarks/README.md and
    examples/README.md reaches a file, and its #anchor a heading (GitHub's slugs); http(s) links are
    not fetched."""
    problems = docs_check.link_problems(ROOT)
    if problems:
        pytest.fail(_report(problems, "dead links or anchors"), pytrace=False)


def test_index_lists_every_page_once_and_honestly() -> None:
    """docs/index.md: one row per page of docs/, link text = file name, a description that starts with
    the page's title in bold, and no status phrase ("nothing yet", "untested", ...) the page does not
    say of itself (the rule in full: :func:`tests.docs_check.index_problems`)."""
    problems = docs_check.index_problems(ROOT)
    if problems:
        pytest.fail(_report(problems, "problems with docs/index.md"), pytrace=False)


def test_horovodrun_flag_table_agrees_with_ringtrain_run(parser: argparse.ArgumentParser) -> None:
    """docs/horovod-conformance.md: a flag marked same/differs is accepted by ``ringtrain run``, one
    marked not supported is refused (unless the notes say it is accepted with a warning, and then the
    launcher's notes name it), and at least 10 flag rows are read (the rule in full:
    :func:`tests.docs_check.conformance_problems`)."""
    problems = docs_check.conformance_problems(ROOT, parser=parser)
    if problems:
        pytest.fail(_report(problems, "disagreements of the flag table with `ringtrain run`"), pytrace=False)


def test_no_diary_markers() -> None:
    """docs/*.md and README.md say what is, not what happened on the way (commit hashes, "used to",
    "load average 7-10", "the development VM", ...: :data:`tests.docs_check.DIARY_MARKERS`)."""
    problems = docs_check.diary_problems(ROOT)
    if problems:
        pytest.fail(_report(problems, "diary markers"), pytrace=False)


# --------------------------------------------------------------------------------------------------
# Each checker fails when it should: planted docs trees
# --------------------------------------------------------------------------------------------------

def test_command_checker_reports_a_stale_flag_and_nothing_that_is_fine(
        tmp_path: Path, parser: argparse.ArgumentParser) -> None:
    root = _plant(tmp_path, {"docs/page.md": """
        # A page

        ```bash
        ringtrain run --no-such-flag -np 2 python train.py
        ringtrain run -np 2 python train.py --epochs 1 --no-such-flag-of-the-script
        ringtrain run -np N -H host1:2,host2:2 --nproc_per_node=4 --min-np/--max-np 2 train.py --lr 1
        srun -N 2 ringtrain run --max-restarts 3 ringtrain train mnist --epochs 1   # a comment --bogus
        ringtrain script slurm -N 2 --nproc-per-node 4 -- python train.py --bogus
        ringtrain train mnist --epochs 1 \\
            --not-a-train-flag
        ringtrain run: error: --bogus is not a flag (quoted output, not a command)
        horovodrun -np 4 --fusion-threshold-mb 32 --no-hierarchical-allreduce python train.py
        pip install ringtrain
        ringtrain run ... python train.py --anything
        ```

        Inline: `ringtrain run -np 2 --gloo-timeout-seconds 30 python train.py`, `ringtrain bench --np
        1,2 -- python x.py --steps 3`, `ringtrain scrpit slurm`, `ringtrain train nosuch`,
        `horovodrun --autotune-nonsense`, `ringtrain script pbs --walltime 1`, `ringtrain WORKLOAD`.

        ```python
        import ringtrain  # a python block: not shell
        ringtrain.run("--bogus")
        ```
        """})
    problems = docs_check.command_problems(root, parser=parser)
    messages = [(p.line, p.message.split(":", 1)[0]) for p in problems]
    assert messages == [
        (4, "`ringtrain run` has no option --no-such-flag"),
        (9, "`ringtrain train` has no option --not-a-train-flag"),
        (18, "`ringtrain train`"),
        (18, "`ringtrain` has no subcommand 'scrpit' (it has"),
        (19, "`horovodrun (ringtrain run)` has no option --autotune-nonsense"),
        (19, "`ringtrain script pbs` has no option --walltime"),
    ], _report(problems, "problems")
    assert all(p.path == "docs/page.md" for p in problems)
    assert "'nosuch' is not a workload" in problems[2].message


def test_link_checker_reports_a_dead_link_and_a_dead_anchor(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "README.md": """
            # Project

            See [the guide](docs/guide.md), [its setup](docs/guide.md#set-it-up-ringtrain-run---ray),
            [the second Notes](docs/guide.md#notes-1), [home](https://example.com/missing.md) and
            [here](#project). `[not a link](nowhere.md)` is code.
            """,
        "docs/guide.md": """
            # Guide

            ## Set it up: `ringtrain run --ray`!

            ## Notes

            ## Notes

            Back to the [readme](../README.md#no-such-heading); the [old page](old.md).

            ```
            [in a fence](also-nowhere.md)
            ```
            """,
    })
    problems = docs_check.link_problems(root)
    assert _lines(problems) == [("docs/guide.md", 9), ("docs/guide.md", 9)], _report(problems, "problems")
    assert "missing file: old.md" in problems[0].message
    assert "missing heading: ../README.md#no-such-heading" in problems[1].message


def test_slug_follows_github() -> None:
    assert docs_check.slug("Any script on a Ray cluster: `ringtrain run --ray`") == \
        "any-script-on-a-ray-cluster-ringtrain-run---ray"
    assert docs_check.slug("Job scripts (`ringtrain script slurm|pbs|lsf`)") == \
        "job-scripts-ringtrain-script-slurmpbslsf"
    assert docs_check.slug("Horovod's own [test suite](x.md) **now**") == "horovods-own-test-suite-now"
    assert docs_check.anchors("# A\n\n## A\n\n## A\n") == {"a", "a-1", "a-2"}


def test_diary_checker_reports_each_marker_and_no_plain_text(tmp_path: Path) -> None:
    root = _plant(tmp_path, {"docs/page.md": """
        # Page

        Restarts used to fail; since c116405 they do not.
        The name is not used to decide; the md5 is `c58f30108f718f92721af3b95e74349a`, the node id
        a9a963b91145, a link https://github.com/o/r/commit/a7fc7d3 and deadbeef (no digit).
        Measured on the 2-core development VM (load
        average 7-10). The `load average` column. We did not isolate why.
        """, "README.md": "# Readme\n\nThe issue's bar holds at this stop (stop 12); they stop 10 s on.\n"})
    problems = docs_check.diary_problems(root)
    found = [(p.path, p.line, p.message.split(":", 1)[0]) for p in problems]
    assert found == [
        ("README.md", 3, "diary marker 'stop N' (a work session's step)"),
        ("README.md", 3, "diary marker 'the issue's' (refers to a tracker issue)"),
        ("README.md", 3, "diary marker 'this stop' (a work session's step)"),
        ("docs/page.md", 3, "diary marker 'used to' (how it was before)"),
        ("docs/page.md", 3, "diary marker commit hash"),
        ("docs/page.md", 6, "diary marker load average of a measurement"),
        ("docs/page.md", 6, "diary marker the development machine"),
        ("docs/page.md", 7, "diary marker 'we did not isolate' (an open investigation)"),
    ], _report(problems, "problems")
    assert "'c116405'" in problems[4].message


_TABLE_HEAD = textwrap.dedent("""
    # Horovod conformance

    ## `horovod.torch`

    | API | | Notes |
    |---|---|---|
    | `--not-a-flag-table` | same | (another section: not read) |

    ## `horovodrun` flags (`ringtrain run`)

    | Flag | | Notes |
    |---|---|---|
    """)


def test_conformance_checker_reports_a_false_support_claim(
        tmp_path: Path, parser: argparse.ArgumentParser) -> None:
    rows = [
        "| `-np`, `--num-proc` | same | |",
        "| `--no-such-flag` | same | |",
        "| `--tcp` | differs | Accepted with a warning. |",
        "| `--torus-allreduce` / `--no-torus-allreduce` | differs | Accepted with a warning. |",
        "| `--min-np`, `--max-np` | not supported | |",
        "| `--autotune` | not supported | Accepted with one warning. `--verbose`, `-prefix-timestamp`: not "
        "supported. |",
        "| `--config-file` | not supported | |",
        "| `--jsrun` | refused | |",
        "| `-v`, `--version` | differs | `ringtrain --version` (not under `run`). |",
        "| `--gloo` | maybe | |",
        "| `--mpi` | differs | |",
    ]
    root = _plant(tmp_path, {docs_check.CONFORMANCE_PAGE: _TABLE_HEAD + "\n".join(rows) + "\n"})
    problems = docs_check.conformance_problems(root, parser=parser)
    first = 13  # the line of the first row
    found = [(p.line - first, p.message) for p in problems]
    taken = "is marked not supported but `ringtrain run` accepts it (say what it does, or refuse it)"
    assert found == [
        (1, "--no-such-flag is marked supported but `ringtrain run` does not accept it"),
        (2, "--tcp is said to be accepted with a warning, but `ringtrain run` says nothing about it"),
        (4, f"--max-np {taken}"),
        (4, f"--min-np {taken}"),
        (5, "--verbose is said to be not supported but `ringtrain run` accepts it"),
        (9, "flag row with a status not understood: 'maybe'"),
    ], _report(problems, "problems")


def test_conformance_checker_refuses_a_table_it_cannot_read(
        tmp_path: Path, parser: argparse.ArgumentParser) -> None:
    root = _plant(tmp_path, {docs_check.CONFORMANCE_PAGE: _TABLE_HEAD + "| `-np` | same | |\n"})
    problems = docs_check.conformance_problems(root, parser=parser)
    assert [p.message.split(":")[0] for p in problems] == \
        ["only 1 horovodrun flag rows parsed (at least 10 expected)"]


def test_index_checker_reports_each_broken_rule(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "docs/index.md": """
            # Documentation

            | Page | Title: what it holds |
            |---|---|
            | [a.md](a.md) | **Page A**: fine |
            | [b.md](b.md) | **Page B, renamed**: what it holds |
            | [b.md](b.md) | **Page B**: twice |
            | [gpu.md](gpu.md) | **GPUs**: verified on nothing yet, untested |
            | [the c page](c.md) | **Page C** |
            | [gone.md](gone.md) | **Gone**: a page that was removed |
            | [untitled.md](untitled.md) | **Untitled**: a page without a title |
            | [../benchmarks/README.md](../benchmarks/README.md) | Every benchmark |
            """,
        "docs/a.md": "# Page A\n",
        "docs/b.md": "# Page B\n",
        "docs/c.md": "# Page C\n",
        "docs/gpu.md": "# GPUs\n\nVerified on one H200. Multi-node: untested.\n",
        "docs/orphan.md": "# Orphan\n",
        "docs/untitled.md": "Text, no heading.\n",
        "benchmarks/README.md": "# Benchmarks\n",
    })
    problems = docs_check.index_problems(root)
    found = [(p.line, p.message) for p in problems]
    assert found == [
        (0, "docs/orphan.md has no row in the index"),
        (6, "row of b.md gives the title 'Page B, renamed', the page's is 'Page B'"),
        (7, "docs/b.md has 2 rows (lines 6, 7)"),
        (8, "row says 'nothing yet' of gpu.md, the page does not"),
        (9, "row's link text 'the c page' is not its file name 'c.md'"),
        (10, "row links to a missing file: gone.md"),
        (11, "untitled.md has no title (a first `# ` heading)"),
    ], _report(problems, "problems")
