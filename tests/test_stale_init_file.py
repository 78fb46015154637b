"""RDZV005 beyond its Example and near-miss: what counts as the init file, what as the failure.
The real case: logs of a relaunch over a killed run's file (test at the end)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.collectors import CollectOptions, collect
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


RELAUNCH = """
import os, sys, time, traceback
from datetime import timedelta
import torch.distributed as dist
rank, url = int(os.environ["RANK"]), sys.argv[sys.argv.index("--dist-url") + 1]
if rank == 0:
    time.sleep(3)  # its node comes up late
try:
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    print(f"rank {rank} joined", flush=True)
except RuntimeError:
    traceback.print_exc()
time.sleep(120)
"""


def _load_repro() -> object:
    path = Path(__file__).parent.parent / "scripts" / "repro_stale_init_file.py"
    spec = importlib.util.spec_from_file_location("repro_stale_init_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.scenario
def test_collect_counts_the_users_of_a_stale_init_file(tmp_path: Path) -> None:
    """A real killed run leaves its FileStore; collect on the relaunch reads the file's refcount
    (the 2 dead users plus the relaunch's live ones: more than the world of 2, whichever way
    the relaunch's own connects went) and RDZV005 names the file from the bundle alone."""
    init = tmp_path / "dist_init"
    _load_repro().leave_stale_file(init)  # type: ignore[attr-defined]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    procs = []
    for rank in (1, 0):
        with (tmp_path / f"rank{rank}.log").open("wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RELAUNCH, "--dist-url", f"file://{init}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**env, "RANK": str(rank), "WORLD_SIZE": "2"}))
    try:
        time.sleep(10)  # rank 1 gave up or both joined; rank 0 at least is in init
        result = collect(CollectOptions(pid=procs[1].pid, out=tmp_path / "bundle",
                                        logs=[tmp_path / "rank0.log", tmp_path / "rank1.log"]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    (found,) = result.manifest["init_files"]
    # The killed run's two users never left; a relaunched rank whose init failed released its
    # own count, so the file counts 2 to 4 users.
    assert found["path"] == str(init) and found["filestore"] and found["refcount"] in (2, 3, 4)
    analysis = run(load([tmp_path / "bundle"]))
    (f,) = [f for f in analysis.findings if f.rule == "RDZV005"]
    assert str(init) in f.summary
    logs = "".join((tmp_path / f"rank{r}.log").read_text() for r in (0, 1))
    failed = "connectFullMesh failed" in logs
    # A root cause when a rank failed to connect or still waits in init_process_group (on a
    # loaded machine both may still be there at collection); otherwise a hazard only.
    waiting = "wait in init_process_group" in f.summary or "waits in init_process_group" in \
        f.summary
    assert f.role == ("root_cause" if failed or waiting else "info"), (f.role, f.summary)
    if found["refcount"] > 2:
        assert f"counts {found['refcount']} users, more than the world size of 2" in f.summary
