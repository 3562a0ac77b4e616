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


@pytest.mark.slow
def test_a_fresh_clone_trains_on_synthetic_ratings_and_says_so(tmp_path) -> None:
    # no MovieLens anywhere: an empty cache, no --data-dir (the README's line)
    result = run_example("movielens_recommender.py", ["--epochs", "2"], env={"RINGTRAIN_DATA": str(tmp_path)})
    assert result.returncode == 0, explain(result)
    out = unprefixed(result.stdout)
    assert out.count("no MovieLens ratings in ringtrain's cache: training on synthetic ratings") == 1, \
        explain(result)
    assert "2 workers, 40000 training and 10000 test ratings, 1000 users, 500 movies" in out, explain(result)
    final = re.search(r"^test RMSE ([\d.]+), global-mean baseline ([\d.]+)$", out, flags=re.M)
    assert final, explain(result)
    assert float(final[1]) < float(final[2]), explain(result)
