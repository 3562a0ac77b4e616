"""examples/hello.py: every rank answers, and the allreduce between them is right."""

import re

import pytest

from tests.examples.launch import explain, run_example


@pytest.mark.slow
def test_every_rank_says_hello() -> None:
    result = run_example("hello.py", nproc=2)
    assert result.returncode == 0, explain(result)
    lines = re.findall(r"hello from rank (\d) of (\d) \(local rank (\d) of (\d)\) on \S+: sum of ranks 1 ok",
                       result.stdout)
    assert sorted(lines) == [("0", "2", "0", "2"), ("1", "2", "1", "2")], explain(result)
