"""examples/movielens_recommender.py on the real ml-latest-small: it learns, and beats the mean."""

import re

import pytest

from tests.examples.launch import SHARED_DATA, explain, run_example, unprefixed

MOVIELENS = SHARED_DATA / "movielens"


@pytest.mark.slow
@pytest.mark.skipif(not (MOVIELENS / "ml-latest-small" / "ratings.csv").is_file(),
                    reason="MovieLens ml-latest-small is not in ../shared/data/movielens beside the repo")
def test_beats_the_global_mean_baseline() -> None:
    result = run_example("movielens_recommender.py", ["--data-dir", str(MOVIELENS), "--epochs", "2"])
    assert result.returncode == 0, explain(result)
    assert "2 workers, 80669 training and 20167 test ratings, 610 users, 9724 movies" in result.stdout, \
        explain(result)
    out = unprefixed(result.stdout)
    train = [float(x) for x in re.findall(r"train RMSE ([\d.]+)", out)]
    assert len(train) == 2, explain(result)
    assert train[1] < train[0], explain(result)
    final = re.search(r"^test RMSE ([\d.]+), global-mean baseline ([\d.]+)$", out, flags=re.M)
    assert final, explain(result)
    test_rmse, baseline = float(final[1]), float(final[2])
    # Always guessing the mean is about 1.04 stars off on this split; a working model is clearly better.
    assert 1.0 < baseline < 1.1, explain(result)
    assert test_rmse < 0.95 * baseline, explain(result)
