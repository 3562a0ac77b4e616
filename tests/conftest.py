"""Shared fixtures: pools of real ranks, reused by every test of a session; the ``cuda`` marker's skip;
the ``hygiene`` check that fails a test which leaves something behind (tests/hygiene.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hygiene import KINDS, Snapshot, keep_across_tests, leaks
from tests.ordering import longest_modules_first
from tests.ranks import RankPool


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"leaks(*kinds, reason): the test may leave these behind ({', '.join(KINDS)}); the hygiene fixture "
        "does not check them. reason= says why (tests/conftest.py's hygiene).")


def cuda_missing_reason() -> str | None:
    """Why the ``cuda`` tests cannot run here, or None when torch sees a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return (f"needs a CUDA GPU: torch {torch.__version__} ({build}) sees none. HINT: run `python -m pytest "
            "-m cuda` on a machine with a GPU and a CUDA build of torch (docs/gpu.md)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the longest modules first (tests/ordering.py); skip every test marked ``cuda`` (also through a
    parameter's marks) where there is no GPU."""
    items[:] = longest_modules_first(items)
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    reason = cuda_missing_reason()
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def hygiene(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves behind environment variables, a torch.distributed default process group,
    ringtrain's engine, non-daemon threads or child processes (tests/hygiene.py names what, and undoes
    what it can so the next tests do not inherit it).

    What a fixture of session, package or module scope keeps across tests does not count: pytest sets
    up fixtures of wider scope before the function-scoped ones, and an autouse fixture first among
    those, so the state before the test already holds them, while the test's own function-scoped
    fixtures (monkeypatch, tmp_path, ...) are torn down before the state after it is taken. What such a
    fixture starts lazily, inside a test (the rank pools below start their ranks at the first ``run``),
    is registered with ``keep_across_tests``.

    A test (or a module, in ``pytestmark``) that leaves something by design says so, narrowly:
    ``@pytest.mark.leaks("threads", reason="...")``; kinds: env, process_group, engine, threads,
    processes.
    """
    allowed: set[str] = set()
    for marker in request.node.iter_markers("leaks"):
        unknown = [kind for kind in marker.args if kind not in KINDS]
        if unknown or not marker.args or not marker.kwargs.get("reason"):
            pytest.fail(f"@pytest.mark.leaks{marker.args!r}: name kinds among {', '.join(KINDS)} and say "
                        f"why with reason='...'", pytrace=False)
        allowed.update(marker.args)
    before = Snapshot.take()
    yield
    found = leaks(before, allowed)
    if found:
        pytest.fail(f"{request.node.nodeid} left behind:\n  " + "\n  ".join(found), pytrace=False)


@pytest.fixture(scope="session")
def ranks2() -> Iterator[RankPool]:
    """Two live ranks on gloo over loopback."""
    pool = RankPool(2)
    keep_across_tests(pool)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def ranks3() -> Iterator[RankPool]:
    """Three live ranks (odd sizes catch uneven splits)."""
    pool = RankPool(3)
    keep_across_tests(pool)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def ranks4() -> Iterator[RankPool]:
    """Four live ranks, oversubscribed on a 2-core machine."""
    pool = RankPool(4)
    keep_across_tests(pool)
    yield pool
    pool.close()
