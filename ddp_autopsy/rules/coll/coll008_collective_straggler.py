"""A rank entered the pending collective long after the others (Flight Recorder).

## What it detects
Every rank of a process group issued the collective the group is stuck in (or last ran), but
one or a few entered it much later than the median rank — a minute or more, or half the
collective's timeout when that is shorter — according to the Flight Recorder's creation time
of each rank's entry.

## Why it hangs or kills the job
The early ranks wait inside the collective for the late one. When the wait exceeds the
process group's timeout (NCCL default 10 minutes, Gloo 30), the watchdog aborts the early ranks
even though nothing is wrong with the collective itself: the late rank was slow — a longer
evaluation or checkpoint on that rank, a slow disk or data source, a throttled or overloaded node.

## Evidence
Each rank's Flight Recorder entry for the collective (creation time and timeout). Times come
from each host's clock: a skew between hosts shifts them, so small delays are not reported.

## Remedy
Find what the late rank did before the collective (its previous call site, its logs, the node's
health). Spread rank-local work evenly or run it on every rank; move slow I/O out of the training
loop; raise the timeout (`init_process_group(timeout=...)`) only to cover legitimately slow
phases.

## Example
```
# Flight Recorder dumps, one line per rank (see flight_recorder.example_dumps)
rank 0: #1 all_reduce [[4]] Float completed @1s | #2 all_reduce [[4]] Float timed-out @10s
rank 1: #1 all_reduce [[4]] Float completed @1s | #2 all_reduce [[4]] Float timed-out @10s
rank 2: #1 all_reduce [[4]] Float completed @1s | #2 all_reduce [[4]] Float started @700s
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer import collectives
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding
from ddp_autopsy.rules.coll._flight_recorder import FlightRecorderRule


class CollectiveStraggler(FlightRecorderRule):
    code = "COLL008"
    slug = "collective-straggler"
    cause = "straggler"
    severity = "warning"

    def check(self, job: Job) -> Iterator[Finding]:
        report = job.collective_report
        for g in report.groups:
            if not g.fr or not g.late or g.not_joined or g.stuck_at is None:
                continue
            calls = g.calls_at(g.stuck_at)
            late = dict(sorted(g.late.items()))
            call = calls[next(iter(late))]
            timeout = f" (their timeout: {call.timeout_ms / 1000:.0f} s)" if call.timeout_ms \
                else ""
            delays = ", ".join(f"rank {r} {s:.0f} s" for r, s in list(late.items())[:4])
            summary = (f"{collectives.rank_list(late).capitalize()} entered {call.op} "
                       f"#{g.stuck_at} of {g.label} long after the other ranks ({delays} after "
                       f"the median rank){timeout}.")
            early = next((r for r in sorted(calls) if r not in late), None)
            shown = [*list(late)[:2], *([early] if early is not None else [])]
            evidence = [Evidence(path=calls[r].source or "", line=None, rank=r,
                                 host=calls[r].host,
                                 text=f"rank {r}: {calls[r].describe()}, created "
                                      f"{calls[r].time_created.isoformat() if calls[r].time_created else '?'}")
                        for r in shown]
            exceeded = bool(call.timeout_ms) and max(late.values()) * 1000 >= call.timeout_ms
            yield self.finding(
                summary,
                evidence=evidence,
                ranks=late,
                hosts=[calls[r].host for r in late],
                confidence=0.8 if exceeded else 0.65,
                role=None if report.stuck else "info",
                details={"process_group": g.name, "group_desc": g.desc,
                         "sequence_number": g.stuck_at, "late_seconds": {
                             str(r): round(s, 1) for r, s in late.items()},
                         "timeout_ms": call.timeout_ms, "exceeded_timeout": exceeded},
            )
