"""RDZV005 beyond its Example and near-miss: what counts as the init file, what as the failure.
The real case: logs of a relaunch over a killed run's file (test at the end)."""

from __future__ import annotations

from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

CASES = Path(__file__).parent / "rules" / "cases"

REFUSED = ("[rank3]: RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/"
           "third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: "
           "Connection refused, remote=[10.1.0.9]:52114$1\n")


def codes(tmp_path: Path) -> set[str]:
    return {f.rule for f in run(load([tmp_path])).findings}


def test_a_refused_connect_without_an_init_file_is_not_blamed_on_one(tmp_path: Path) -> None:
    (tmp_path / "rank3.log").write_text("[rank3]: init_method=env://\n" + REFUSED)
    assert "RDZV005" not in codes(tmp_path)


def test_the_init_file_from_an_argument_dump(tmp_path: Path) -> None:
    (tmp_path / "rank3.log").write_text(
        "[rank3]: Namespace(batch_size=64, dist_url='file:///nfs/run/dist_init', lr=0.1)\n"
        + REFUSED)
    analysis = run(load([tmp_path]))
    assert analysis.verdict is not None and analysis.verdict.rule == "RDZV005"
    assert analysis.verdict.ranks == [3] and "/nfs/run/dist_init" in analysis.verdict.summary
    assert "10.1.0.9:52114, connection refused" in analysis.verdict.summary


def test_nccl_bootstrap_failures_count_and_other_nccl_connects_do_not(tmp_path: Path) -> None:
    url = "| distributed init (rank 0): file:///nfs/run/dist_init\n"
    (tmp_path / "a.log").write_text(
        url + "node1:4242:4250 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "10.1.0.4<34567> failed : Software caused connection abort\n")
    assert "RDZV005" not in codes(tmp_path)
    (tmp_path / "a.log").write_text(
        url + "node1:4242:4250 [0] bootstrap.cc:90 NCCL WARN Bootstrap : Connect to "
        "10.1.0.4<34567> failed : Connection refused\n")
    assert "RDZV005" in codes(tmp_path)


def test_a_real_relaunch_over_a_killed_runs_file() -> None:
    """Logs of a real relaunch (``scripts/repro_stale_init_file.py``, kept in
    ``tests/rules/cases/RDZV005``): rank 1 read the killed run's address of rank 0."""
    analysis = run(load([CASES / "RDZV005"]))
    verdict = analysis.verdict
    assert verdict is not None and verdict.rule == "RDZV005" and verdict.ranks == [1]
    assert "connection refused" in verdict.summary
    crash = next(f for f in analysis.findings if f.rule == "CRASH001")
    assert crash.role == "symptom" and crash.explained_by == verdict.id
