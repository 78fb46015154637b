"""COLL010 across files: rank 0's own log ends in its own work, the others' logs in timeouts."""

from __future__ import annotations

from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

TIMEOUT = ("[rank{r}]:[E1122 10:31:02.120000000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog "
           "caught collective operation timeout: WorkNCCL(SeqNum=5012, OpType=ALLREDUCE, "
           "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800042 milliseconds before "
           "timing out.\n")


def test_the_rank_whose_log_ends_in_its_own_work(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(
        "[rank0]: epoch 3 done\n[rank0]: Evaluating on rank 0: 40%|####      | 40/100\n")
    for r in (1, 2):
        (tmp_path / f"rank{r}.log").write_text(f"[rank{r}]: epoch 3 done\n" + TIMEOUT.format(r=r))
    analysis = run(load([tmp_path]))
    verdict = analysis.verdict
    assert verdict is not None and verdict.rule == "COLL010" and verdict.ranks == [0]
    assert "ranks 1, 2 timed out" in verdict.summary and "(evaluating)" in verdict.summary


def test_not_when_the_busy_rank_is_the_only_one_timing_out(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(
        "[rank0]: Evaluating on rank 0: 40%|####      | 40/100\n" + TIMEOUT.format(r=0))
    assert not [f for f in run(load([tmp_path])).findings if f.rule == "COLL010"]
