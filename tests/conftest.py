"""Shared fixtures: the scenario library (real failing distributed jobs, see tests/scenarios/).

Scenarios are run lazily and at most once per test process: a test asking for one scenario
runs only that one. Without xdist, the scenarios the selected tests will need are all queued
as soon as the first of them is asked for, and run two at a time (the reference machine has 2
cores). Under pytest-xdist each worker runs only what its own tests ask for, one at a time,
so ``-n 2`` still runs two jobs at once and never runs a scenario twice in one worker.

    @pytest.mark.scenario("port_in_use")       # the name lets the session queue it early
    def test_something(scenario_run):
        run = scenario_run("port_in_use")        # a ScenarioRun; see tests/scenarios/runner.py

Parametrized tests marked ``scenario`` are queued by their parameter values that name a
scenario; tests using ``scenario_runs`` (all of them) queue the whole library.

``DDP_AUTOPSY_KEEP_ARTIFACTS=1`` also copies every run to ``tests/artifacts/scenarios/<name>``.
"""

from __future__ import annotations

import os
import shutil
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from scenarios.runner import SCENARIOS, ScenarioRun, run_scenario

TESTS_DIR = Path(__file__).resolve().parent
ARTIFACTS_DIR = TESTS_DIR / "artifacts" / "scenarios"
PARALLEL = 2
_NEEDED = pytest.StashKey[list[str]]()


class ScenarioCache:
    """Runs each scenario at most once, on a small thread pool, and hands out the results."""

    def __init__(self, workdir: Path, keep_dir: Path | None, parallel: int) -> None:
        self.workdir = workdir
        self.keep_dir = keep_dir
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="scenario")
        self._futures: dict[str, Future[ScenarioRun]] = {}
        self._lock = threading.Lock()

    def submit(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                if name not in SCENARIOS:
                    raise KeyError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}")
                if name not in self._futures:
                    self._futures[name] = self._pool.submit(self._run, name)

    def get(self, name: str) -> ScenarioRun:
        self.submit([name])
        return self._futures[name].result()

    def get_many(self, names: Iterable[str]) -> dict[str, ScenarioRun]:
        names = list(names)
        self.submit(names)
        return {name: self._futures[name].result() for name in names}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, name: str) -> ScenarioRun:
        run = run_scenario(name, self.workdir)
        if self.keep_dir is not None:
            dest = self.keep_dir / name
            try:  # xdist workers may copy the same scenario at once: last one wins
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(run.dir, dest, symlinks=True, dirs_exist_ok=True)
            except OSError as exc:
                warnings.warn(f"could not keep {name} artifacts in {dest}: {exc}", stacklevel=1)
        return run


def _names_for(item: pytest.Item) -> set[str]:
    """The scenarios a collected test will ask for, as far as its markers and params tell."""
    if "scenario_runs" in getattr(item, "fixturenames", ()):
        return set(SCENARIOS)
    marker = item.get_closest_marker("scenario")
    if marker is None:
        return set()
    names = {a for a in marker.args if isinstance(a, str) and a in SCENARIOS}
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names |= {v for v in callspec.params.values() if isinstance(v, str) and v in SCENARIOS}
    return names


def pytest_collection_finish(session: pytest.Session) -> None:
    needed: list[str] = []
    for item in session.items:  # in run order, after -k / -m deselection
        needed += sorted(_names_for(item) - set(needed))
    session.config.stash[_NEEDED] = needed


@pytest.fixture(scope="session")
def _scenario_cache(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScenarioCache]:
    keep = os.environ.get("DDP_AUTOPSY_KEEP_ARTIFACTS") == "1"
    cache = ScenarioCache(
        tmp_path_factory.mktemp("scenarios"),
        keep_dir=ARTIFACTS_DIR if keep else None,
        parallel=PARALLEL,
    )
    if "PYTEST_XDIST_WORKER" not in os.environ:
        # A worker only learns its tests one by one, so it cannot queue ahead without
        # running scenarios another worker's tests need; in one process, queue everything.
        cache.submit(request.config.stash.get(_NEEDED, []))
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def scenario_run(_scenario_cache: ScenarioCache) -> Callable[[str], ScenarioRun]:
    """``scenario_run(name) -> ScenarioRun``: run scenario ``name`` (once) and return it.

    Skips the calling test when this machine cannot reproduce the scenario (``run.skipped``).
    """

    def get(name: str) -> ScenarioRun:
        run = _scenario_cache.get(name)
        if run.skipped:
            pytest.skip(f"scenario {name}: {run.skipped}")
        return run

    return get


@pytest.fixture(scope="session")
def scenario_runs(_scenario_cache: ScenarioCache) -> dict[str, ScenarioRun]:
    """Every scenario of the library, run once: ``{name: ScenarioRun}``."""
    return _scenario_cache.get_many(sorted(SCENARIOS))


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; repeated so this conftest works on its own.
    config.addinivalue_line("markers", "scenario: drives a real torchrun / mp.spawn job (slow)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    keep = os.environ.get("DDP_AUTOPSY_KEEP_ARTIFACTS") == "1"
    where = f" (kept in {ARTIFACTS_DIR})" if keep else ""
    return [f"ddp-autopsy scenarios: {len(SCENARIOS)} available{where}"]
