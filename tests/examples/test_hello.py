"""examples/hello.py: under either launcher every rank answers, and the allreduce between them is right."""

import re

import pytest

from tests.examples.launch import LAUNCHERS, explain, run_example, unprefixed


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_rank_says_hello(launcher: str) -> None:
    result = run_example("hello.py", nproc=2, launcher=launcher)
    assert result.returncode == 0, explain(result)
    # Not anchored to lines: under torchrun both ranks share one stdout, and a print's text and its
    # newline are two writes, so one rank's line may be glued to the other's.
    pattern = r"hello from rank (\d) of (\d) \(local rank (\d) of (\d)\) on \S+: sum of ranks 1 ok"
    lines = re.findall(pattern, unprefixed(result.stdout))
    assert sorted(lines) == [("0", "2", "0", "2"), ("1", "2", "1", "2")], explain(result)
