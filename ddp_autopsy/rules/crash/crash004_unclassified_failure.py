"""Something failed that no rule explains: the earliest failure, as a labelled best effort.

## What it detects
Runs only when no other rule found a root cause. If the inputs still hold a failure — an
exception, a non-zero exit, an NCCL or c10d error, a timeout — the verdict is never silent: this
rule names the earliest failing rank, host and line, with a low confidence, and the rules that
were tried. An error of the environment that every process raises alike while setting up, which
no class of the catalog describes (a torch build without the libuv store, "use_libuv was requested
but PyTorch was build without libuv support"; a Windows Gloo without a transport,
"makeDeviceForHostname(): unsupported gloo device"; accelerate's check of consumer GPUs without
P2P or InfiniBand), is said to be that, with what is known to fix it.

## Why it hangs or kills the job
Unknown: the failure is one the catalog does not know yet (or a fragment too short to tell).
The earliest failure is usually the cause and the later ones its consequences; timeouts alone
only say that the ranks waited for someone.

## Evidence
The earliest failure line (by time where the clocks agree, else input order) and the first few
after it.

## Remedy
Read the quoted line and what the rank did just before it; if it is a known failure that
ddp-autopsy should recognise, please report it with the log. A stack dump of a hung job
(`ddp-autopsy collect`) or Flight Recorder dumps (`TORCH_FR_BUFFER_SIZE=2000`) give far more to
go on than logs alone.

## Example
```
[rank3]:[E0412 08:03:11.115000000 ProcessGroupNCCL.cpp:1870] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.attribution import STREAM_TASK
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.rules.base import Finding, Rule, earliest_first, excerpt, rank_phrase
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE, setup_error


def failing_kinds() -> tuple[str, ...]:
    """Read at each check: configured log patterns add kinds (docs/config.md)."""
    return kinds_tagged("failure") + kinds_tagged("crash")


#: Failures that only say a rank waited for, or lost, the others: never a culprit by themselves
#: (an NCCL error is the rank's own, whatever caused it).
WAITING = tuple(k for k in {*kinds_tagged("lost_peer"), *kinds_tagged("hang")}
                if k != "nccl_error")


#: An srun --label task id in a line's stream: a rank or a node's launcher, which the inputs did
#: not settle.
TASK = re.compile(STREAM_TASK)


class UnclassifiedFailure(Rule):
    code = "CRASH004"
    slug = "unclassified-failure"
    cause = "unclassified_failure"
    severity = "error"
    optional = ("crashes",)  # exceptions that did not end their process
    #: Runs after the others, and only when none of them found a root cause.
    fallback = True

    def check(self, job: Job) -> Iterator[Finding]:
        # Warnings are not failures (a name that resolved on the second try, a retry), but a
        # store read's timeout is, at any level: c10d's socket layer warns "waitForInput: socket
        # ... timed out after 600000ms" and then raises (a connect's may be retried: not that).
        failing = job.active_events.filter(
            pl.col("kind").is_in(failing_kinds())
            & (~pl.col("level").fill_null("").is_in(["W", "I", "WARNING", "INFO"])
               | ((pl.col("kind") == "store_wait_timeout")
                  & pl.col("text").str.contains("timed out after", literal=True))))
        if failing.height == 0:
            return
        # NCCL's return-code trail while it probes its network plugins ("NCCL INFO net.cc:79 ->
        # 3" with NCCL_IBEXT_DISABLE=1) is no failure when the same process then says which
        # network it uses ("NCCL INFO Using network Socket"): NCCL went on
        chosen = job.of_kind("nccl_net_choice").select("source", "pid", pl.col("line")
                                                       .alias("_chosen"))
        if chosen.height and failing.height:
            failing = (failing.join(chosen.group_by("source", "pid").agg(pl.col("_chosen").max()),
                                    on=["source", "pid"], how="left", nulls_equal=True)
                       .filter(~((pl.col("kind") == "nccl_error_trace")
                                 & (pl.col("line") < pl.col("_chosen")).fill_null(False)))
                       .drop("_chosen"))
            if failing.height == 0:
                return
        kept = job.crashes.survived
        if kept:  # exceptions that did not end their process are no failure to explain
            failing = failing.join(pl.DataFrame(list(kept), schema=["source", "line"],
                                                orient="row"), on=["source", "line"], how="anti")
            if failing.height == 0:
                return
        # (an NCCL error is the rank's own: CRASH001 calls it a consequence, not a crash of the
        # rank's code; here it is the failure to name, unless it reports a peer's)
        own = failing.filter(
            ~pl.col("kind").is_in(WAITING)
            & (~pl.col("text").str.contains(f"(?i){CONSEQUENCE.pattern}")
               | ((pl.col("kind") == "nccl_error")
                  & ~pl.col("text").str.contains(r"(?i)ncclRemoteError|remote process exited"))
               # (nor is a launcher's failed command, when nothing else failed: what it ran)
               | pl.col("text").str.contains("CalledProcessError")))
        rows = earliest_first(job.decoded_rows(own if own.height else failing))
        # within one file, its lines' order is time's, stamped or not: an unstamped line above
        # the earliest stamped one came first
        above = [r for r in rows if r["source"] == rows[0]["source"]
                 and r["line"] < rows[0]["line"]]
        if above:
            first = min(above, key=lambda r: r["line"])
            rows = [first, *(r for r in rows if r is not first)]
        first = rows[0]
        if own.height:
            task = TASK.search(first.get("stream") or "")
            who = f"rank {first['rank']}" if first["rank"] is not None else \
                f"srun task {task.group(1)}" if task else "a process"
            where = f" on {first['host']}" if first.get("host") else ""
            summary = (f"No rule explains this failure; the earliest the inputs show is "
                       f"{who}{where}: {excerpt(first['text'])}")
            ranks = [first["rank"]]
        else:
            waiting = sorted(set(failing["rank"].drop_nulls().to_list()))
            summary = (f"{rank_phrase(waiting, empty='Some ranks').capitalize()} timed out or "
                       "lost their peers, and the inputs do not show whom they waited for "
                       f"(first: {excerpt(first['text'])})")
            ranks = []
        known = setup_error(first["text"])
        if known:
            # (an error of the environment every rank raises alike: no class of the catalog,
            # but what is known of it is said)
            summary = (f"Every process fails the same way while setting up, with an error of "
                       f"this environment, not of one rank: {excerpt(first['text'])}. {known}")
            ranks = []
        yield self.from_rows(rows, summary, shown=3, ranks=ranks, hosts=[first.get("host")],
                             confidence=0.25, ts=first["ts"],
                             details={"kind": first["kind"], "failures": failing.height,
                                      "known_setup_error": bool(known)})

