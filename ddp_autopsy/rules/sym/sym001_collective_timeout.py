"""Ranks timed out waiting in a collective (a symptom).

## What it detects
The NCCL watchdog's "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..,
OpType=..)", its failure summary ("last enqueued work: N, last completed work: M"), and Gloo's
"Timed out waiting 1800000ms for recv operation to complete", the watchdog's abort stack
(`WorkNCCL::checkTimeout`) when the message itself is missing, and the heartbeat monitor's
"watchdog got stuck for 600 seconds" (the watchdog itself waited on a hung CUDA/NCCL call).

## Why it hangs or kills the job
These ranks were waiting for a peer that did not arrive; the watchdog then aborts them. The
timeout is what every healthy rank reports: the cause is on the rank that was late or absent.

## Evidence
The timeout lines per rank, with the operation and sequence number; the rank with the lowest
last completed work is the laggard.

## Remedy
Find the root cause among the other findings (a rank that crashed, is stuck elsewhere, or called
a different collective). Raising the timeout only helps when a rank was legitimately slow
(rank-0-only evaluation or checkpointing).

## Example
```
[rank15]:[E726 13:23:24.941166255 ProcessGroupNCCL.cpp:616] [Rank 15] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1201955, OpType=ALLREDUCE, NumelIn=7020002, NumelOut=7020002, Timeout(ms)=1800000) ran for 1800066 milliseconds before timing out.
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, ranks_of, subject


class CollectiveTimeout(Rule):
    code = "SYM001"
    slug = "collective-timeout"
    role = "symptom"
    severity = "warning"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("watchdog_timeout", "gloo_timeout", "watchdog_summary", "watchdog_abort",
                        "watchdog_hang")
        if not rows:
            return
        ranks = ranks_of(rows)
        ops = sorted({f"{r['data']['op']} #{r['data'].get('seq', '?')}" for r in rows
                      if r["kind"] == "watchdog_timeout" and r["data"].get("op")})
        what = f" in {', '.join(ops[:3])}" if ops else ""
        who = subject(ranks, "Ranks")
        yield self.from_rows(rows, f"{who} timed out waiting for peers{what}.", ranks=ranks,
                             confidence=0.9)
