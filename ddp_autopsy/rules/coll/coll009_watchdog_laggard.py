"""The watchdog's counters or the desync report show ranks that never joined a collective.

## What it detects
Without Flight Recorder dumps, the logs still carry per-rank counters: the NCCL watchdog's
failure summary ("failure detected by watchdog at work sequence id: 183 PG status: last
enqueued work: 183, last completed work: 182"), its timeout lines (op and sequence number per
rank) and the desync report ("[7] finished collective #182, but didn't join collective #183").
Per process group, the rule finds the collective the ranks timed out in and the ranks whose
counters stop before it.

## Why it hangs or kills the job
The ranks that enqueued the collective wait for the ones that never did, until the watchdog's
timeout aborts them. The ranks that stopped short are elsewhere: rank-local work, another
process group's collective, a code path with fewer collectives.

## Evidence
The watchdog summary, timeout and desync lines, per rank and process group (the `[PG ID n PG
GUID g Rank r]` prefix). When Flight Recorder dumps cover the group, COLL005 reports it with
more detail and this rule stays silent.

## Remedy
See what the lagging ranks were doing (their own logs, a stack dump taken while the job hangs
with `ddp-autopsy collect`), then make every rank issue the same collectives; enable the Flight
Recorder (`TORCH_FR_BUFFER_SIZE=2000`, `TORCH_FR_DUMP_ON_TIMEOUT=1`) to get call sites.

## Example
```
[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 315 PG status: last enqueued work: 315, last completed work: 314
[rank1]:[E515 18:36:47.343391012 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 315 PG status: last enqueued work: 315, last completed work: 314
[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1937] Rank 0
         - [0] Timeout at collective: ALLREDUCE, #315
         - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
             [2] finished collective #314, but didn't join collective #315 (count from 1)
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer import collectives
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE, laggard_native_crash


class WatchdogLaggard(Rule):
    code = "COLL009"
    slug = "watchdog-laggard"
    cause = "rank_stuck_outside_collective"

    def check(self, job: Job) -> Iterator[Finding]:
        report = job.collective_report
        # (a rank whose only failure reports a lost peer, after the others' timeout, still lagged)
        # (a lone laggard whose process crashed: CRASH001 names it)
        crashed_laggard = laggard_native_crash(job)
        crashed = {r["rank"] for r in job.decoded_rows(job.crashes.events)
                   if r["rank"] is not None and not CONSEQUENCE.search(r["text"])}
        for g in report.groups:
            if g.fr or g.stuck_at is None:
                continue
            lagging = {r: last for r, last in g.not_joined.items() if r not in crashed}
            if not lagging or not g.waiting:
                continue
            if set(lagging) == {crashed_laggard}:
                continue
            rows = g.log_rows
            who = collectives.rank_list(lagging)
            lasts = sorted(set(lagging.values()))
            ops = sorted({s.timed_out_op for s in g.ranks.values() if s.timed_out_op})
            op = f"{'/'.join(ops)} " if ops else "collective "
            summary = (f"{who[0].upper()}{who[1:]} never joined {op}#{g.stuck_at} of {g.label}: "
                       f"{collectives.rank_list(g.waiting)} timed out in it while {who} "
                       f"stopped after #{', #'.join(map(str, lasts[:4]))}.")
            best = sorted(rows, key=lambda r: r.get("rank") not in lagging)
            yield self.finding(
                summary,
                evidence=[evidence_of(r) for r in best[:3]],
                ranks=lagging,
                confidence=0.8,
                ts=first_ts(rows),
                details={"process_group": g.name, "group_desc": g.desc,
                         "sequence_number": g.stuck_at, "waiting_ranks": g.waiting,
                         "not_joined": {str(r): v for r, v in sorted(lagging.items())}},
            )
