"""The engine: outcomes, crash isolation, root cause vs symptom."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.base import Rule
from ddp_autopsy.rules.engine import registry, run

CRASH_THEN_SYMPTOMS = """\
[rank0]:[E1122 08:00:10.100000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=60000) ran for 60012 milliseconds before timing out.
[rank2]: Traceback (most recent call last):
[rank2]:   File "/w/train.py", line 25, in train_step
[rank2]:     raise ValueError("bad batch 17")
[rank2]: ValueError: bad batch 17
[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45067
W1122 08:00:11.000000 77 torch/distributed/elastic/multiprocessing/api.py:908] Sending process 80 closing signal SIGTERM
"""


def test_first_failure_is_root_and_the_rest_are_linked_symptoms(tmp_path: Path) -> None:
    (tmp_path / "console.log").write_text(CRASH_THEN_SYMPTOMS)
    analysis = run(load([tmp_path]))
    verdict = analysis.verdict
    assert verdict is not None and verdict.cause == "rank_crashed" and verdict.ranks == [2]
    assert "ValueError: bad batch 17" in verdict.summary and "train_step" in verdict.summary
    symptoms = [f for f in analysis.findings if f.role == "symptom"]
    assert {f.rule for f in symptoms} == {"SYM001", "SYM002", "SYM003"}
    assert all(f.explained_by == verdict.id for f in symptoms)
    assert analysis.findings[0] is verdict


def test_specific_cause_demotes_the_crash_it_explains(tmp_path: Path) -> None:
    (tmp_path / "r.log").write_text(
        "[rank11]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB.\n")
    analysis = run(load([tmp_path]))
    assert analysis.verdict.cause == "out_of_memory"
    crash = next(f for f in analysis.findings if f.cause == "rank_crashed" or f.rule == "CRASH001")
    assert crash.role == "symptom" and crash.explained_by == analysis.verdict.id


def test_a_rank_whose_set_up_failed_is_the_rank_that_never_joined(tmp_path: Path) -> None:
    # blind job nccl_on_cpu_node_rank2: its backend error, the others' reads of its address
    (tmp_path / "r.log").write_text(
        "[rank2]: RuntimeError: Distributed package doesn't have NCCL built in\n"
        "[rank0]: torch.distributed.DistStoreError: wait timeout after 10000ms, keys: "
        "/default_pg/0//cpu//0/2\n"
        "[rank1]: torch.distributed.DistStoreError: wait timeout after 10000ms, keys: "
        "/default_pg/0//cpu//0/2\n")
    analysis = run(load([tmp_path]))
    assert (analysis.verdict.cause, analysis.verdict.ranks) == ("backend_device_mismatch", [2])
    missing = next(f for f in analysis.findings if f.cause == "missing_ranks")
    assert missing.role == "symptom" and missing.explained_by == analysis.verdict.id


def test_a_crash_before_the_launcher_was_signalled_is_the_root(tmp_path: Path) -> None:
    # blind job node1_stale_script_path: one node's workers could not start; a wrapper then
    # SIGTERMed the other node's agent. Its lines are stamped, the failed node's first lines not.
    (tmp_path / "console.log").write_text(
        "node-1: [default0]:/usr/bin/python: can't open file '/job/v1/train.py': [Errno 2] No "
        "such file or directory\n"
        "node-1: E1125 04:16:38.762000 2141 torch/distributed/elastic/multiprocessing/api.py:1002]"
        " failed (exitcode: 2) local_rank: 0 (pid: 2156) of binary: /usr/bin/python\n"
        "node-0: W1125 04:16:56.696000 2139 torch/distributed/elastic/agent/server/api.py:753] "
        "Received 15 death signal, shutting down workers\n"
        "node-0: torch.distributed.elastic.multiprocessing.api.SignalException: Process 2139 got "
        "signal: 15\n")
    analysis = run(load([tmp_path]))
    assert analysis.verdict.cause == "rank_crashed"
    terminated = next(f for f in analysis.findings if f.cause == "job_terminated")
    assert terminated.role == "symptom"


def test_healthy_log_has_no_verdict_and_rules_are_ruled_out(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("step 0 loss 1.0\nstep 1 loss 0.5\n")
    analysis = run(load([tmp_path]))
    assert analysis.verdict is None and not analysis.findings
    status = {o.rule: o.status for o in analysis.outcomes}
    assert status["RDZV001"] == "ruled_out"
    assert status["COLL002"] == "not_evaluated"


def test_a_crashing_rule_is_contained(tmp_path: Path) -> None:
    class Broken(Rule):
        """Always fails.

        ## What it detects
        x
        """

        code = "AUT999"
        slug = "broken"

        def check(self, job):
            raise RuntimeError("boom")

    (tmp_path / "a.log").write_text("[rank3]: ValueError: bad\n")
    analysis = run(load([tmp_path]), rules=(Broken, *registry()))
    broken = next(o for o in analysis.outcomes if o.rule == "AUT999")
    assert broken.status == "errored" and "RuntimeError: boom" in broken.error
    assert analysis.verdict.cause == "rank_crashed"


RESTART = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"
FAILURE = "[rank1]: RuntimeError: boom"


def test_a_clean_restart_supersedes_earlier_failures(tmp_path: Path) -> None:
    """Per source: failures before a run start with no failure after it are history."""
    (tmp_path / "rerun_ok.log").write_text(f"{FAILURE}\n{RESTART}\nstep 1\n")
    (tmp_path / "rerun_failed.log").write_text(f"{FAILURE}\n{RESTART}\n{FAILURE}\n")
    (tmp_path / "once.log").write_text(f"{RESTART}\n{FAILURE}\n")
    # a worker's error pasted above the launcher's only banner, nothing after it: that run's
    (tmp_path / "banner_after.log").write_text(f"{FAILURE}\n{'*' * 41}\n{RESTART}\n{'*' * 41}\n")
    # two banners and nothing after the last: only what came between them is history
    (tmp_path / "twice.log").write_text(f"{FAILURE}\n{RESTART}\n{FAILURE}\n{RESTART}\n")
    job = load([tmp_path])
    src = {Path(s).name: s for s in job.events["source"].unique()}
    assert job.superseded(src["rerun_ok.log"], 1)
    assert not job.superseded(src["rerun_ok.log"], 3)  # after the restart
    assert not job.superseded(src["rerun_failed.log"], 1)
    assert not job.superseded(src["once.log"], 2)
    assert not job.superseded("elsewhere.log", 1)
    assert not job.superseded(src["banner_after.log"], 1)
    assert not job.superseded(src["twice.log"], 1) and job.superseded(src["twice.log"], 3)


def test_a_log_of_nothing_but_exceptions(tmp_path: Path) -> None:
    """30,000 exception lines: the first is the crash. (Each rule looks at the lines once: this
    took minutes when every line's restart check filtered all events.)"""
    lines = [f"[rank{i % 8}]: RuntimeError: boom number {i}" for i in range(30_000)]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    job = load([tmp_path])
    verdict = run(job).verdict
    assert verdict is not None and verdict.cause == "rank_crashed" and verdict.ranks == [0]
    assert "boom number 0" in verdict.summary
    # Memory stays bounded: the earliest 20,000 of a kind are kept, the rest counted.
    assert job.events.filter(pl.col("kind") != "last_line").height == 20_000
    assert [n.message for n in job.notes] == [
        "10000 more 'exception' lines after the first 20000 were counted, not kept"]


def test_stamps_on_clocks_that_cannot_be_compared_do_not_order_crashes(tmp_path: Path) -> None:
    """Rank 1's local stamp reads earlier than rank 0's UTC one, but a host's local clock says
    nothing against UTC: input order decides. On one kind of clock, time decides."""
    (tmp_path / "a.log").write_text("2026-05-01T10:00:05Z [rank0]: RuntimeError: boom zero\n")
    (tmp_path / "b.log").write_text("[2026-05-01 10:00:01,000] [rank1]: RuntimeError: boom one\n")
    assert run(load([tmp_path])).verdict.ranks == [0]
    (tmp_path / "a.log").write_text("[2026-05-01 10:00:05,000] [rank0]: RuntimeError: boom zero\n")
    assert run(load([tmp_path])).verdict.ranks == [1]


def test_the_fallback_runs_only_without_a_root_cause(tmp_path: Path) -> None:
    """CRASH004 names the earliest failure when no rule explains it, and stays out of the way
    when one does."""
    unknown = ("[rank3]:[E0412 08:03:11.115000000 ProcessGroupNCCL.cpp:1870] [PG ID 0 PG GUID "
               "0(default_pg) Rank 3] Process group watchdog thread terminated with exception: "
               "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
               "version 2.21.5")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "console.log").write_text(unknown + "\n")
    analysis = run(load([tmp_path / "a"]))
    assert analysis.verdict.cause == "unclassified_failure" and analysis.verdict.ranks == [3]
    assert "CRASH001" in analysis.verdict.details["rules_tried"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "console.log").write_text(
        unknown + "\n[rank0]:RuntimeError: Address already in use\n")
    analysis = run(load([tmp_path / "b"]))
    assert analysis.verdict.cause == "port_in_use"
    assert all(f.rule != "CRASH004" for f in analysis.findings)
    assert next(o for o in analysis.outcomes if o.rule == "CRASH004").status == "ruled_out"
