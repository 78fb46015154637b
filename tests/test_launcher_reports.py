"""What a launcher's own report of a task says about ranks (srun, mpirun)."""

from __future__ import annotations

from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

CASE = Path(__file__).parent / "rules" / "cases" / "CRASH002-srun-task-oom-then-cancel"


def _verdict(path: Path):
    return run(load([path])).verdict


def test_srun_task_is_the_rank_when_srun_started_the_ranks() -> None:
    (log,) = CASE.glob("*.out")
    verdict = _verdict(log)
    assert (verdict.cause, verdict.ranks) == ("out_of_memory", [2])


def test_srun_task_is_a_node_launcher_under_torchrun(tmp_path: Path) -> None:
    """The same step where srun started one torchrun per node (its agent's lines are in the
    log): task 2 is the third node's launcher, not rank 2, and no rank is named."""
    (log,) = CASE.glob("*.out")
    text = log.read_text().replace(
        "srun: error: gpu07: task 2",
        "W0302 11:04:50.101000 7731 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 7790 closing signal SIGTERM\nsrun: error: gpu07: task 2")
    (tmp_path / "slurm.out").write_text(text)
    verdict = _verdict(tmp_path / "slurm.out")
    assert (verdict.cause, verdict.ranks) == ("out_of_memory", [])
