"""The analyzer benchmark at a tiny size (the full sizes run on demand: docs/performance.md):
it generates one-file-per-rank layouts, times ``analyze`` beside ``rg -c`` and checks that the
verdict names the planted culprit."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench_analyze(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("bench_analyze", "generate"):
        sys.modules.pop(name, None)
    import bench_analyze

    return bench_analyze


def test_tiny_benchmark_finds_the_culprit(bench_analyze, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun --log-dir trees of 16 ranks, 1 MB in all (the layout batching reads)."""
    monkeypatch.setattr(bench_analyze, "OUT", tmp_path)  # results.jsonl and rg patterns too
    ranks = 16
    (row,) = bench_analyze.main(["logdir", "--ranks", str(ranks), "--size", "1M", "--runs", "1",
                                 "--out", str(tmp_path)])
    assert row["culprit_found"], row
    assert row["files"] == ranks + 1  # and expected.json
    assert row["cpu_seconds"] > 0 and row["seconds"] > 0
    if shutil.which("rg"):
        # Times are rounded to 10 ms (ripgrep's can round to 0 here), ratios are not.
        assert row["rg_seconds"] >= 0 and row["floor_seconds"] >= 0
        assert row["ratio_to_rg"] > 0 and row["ratio_to_floor"] > 0
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 1
