"""Some ranks never joined the collective the others wait in (Flight Recorder).

## What it detects
In the Flight Recorder dumps of a process group, the ranks issued collectives up to different
sequence numbers: most ranks issued collective #N (and wait in it) while some stopped at an
earlier one and never issued #N. The rule names the collective, where the waiting ranks called
it from (the first user frame of its stack), the last collective the missing ranks issued, and,
when stack dumps exist, where those ranks are instead.

## Why it hangs or kills the job
A collective completes only when every rank of the group enters it. The ranks that issued #N
block until the missing ones arrive — or until the watchdog's timeout kills them — while the
missing ranks are busy elsewhere: rank-local work (evaluation, checkpointing, a data loader), a
different process group's collective, or a code path that issued fewer collectives.

## Evidence
Flight Recorder dumps of the group's ranks (`pg_status` counters and the entries' sequence
numbers); stack dumps for where the missing ranks are; watchdog timeouts in the logs as
corroboration. It is reported as a root cause when something shows the job was stuck (timeouts
in the logs or in the dumps, ranks waiting in the stacks, a collective pending for a long
time); otherwise (a snapshot of a running job) as information.

## Remedy
Look at what the missing ranks were doing after their last collective (their stacks, or the call
site of their last entry): make rank-local work collective-free or run it on every rank, make
every rank issue the same collectives (no `if rank == 0:` around a collective, no
data-dependent `continue` before one), and raise the timeout only for legitimately slow
rank-local work.

## Example
```
# Flight Recorder dumps, one line per rank (see flight_recorder.example_dumps)
rank 0: #1 all_reduce [[4]] Float completed train.py:41 | #2 all_reduce [[4]] Float timed-out train.py:41
rank 1: #1 all_reduce [[4]] Float completed train.py:41
rank 2: #1 all_reduce [[4]] Float completed train.py:41 | #2 all_reduce [[4]] Float timed-out train.py:41
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer import collectives
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding, evidence_of, first_ts
from ddp_autopsy.rules.coll._flight_recorder import FlightRecorderRule


class CollectiveNotJoined(FlightRecorderRule):
    code = "COLL005"
    slug = "collective-not-joined"
    cause = "rank_stuck_outside_collective"

    def check(self, job: Job) -> Iterator[Finding]:
        report = job.collective_report
        crashed = set(job.crashes.ranks)
        for g in report.groups:
            if not g.fr or g.stuck_at is None or not g.waiting:
                continue
            missing = {r: last for r, last in g.not_joined.items()
                       if r not in crashed and g.ranks.get(r) and g.ranks[r].has_dump}
            if not missing:
                continue
            yield self._finding(job, report, g, missing)

    def _finding(self, job: Job, report: collectives.CollectiveReport,
                 g: collectives.GroupTimeline, missing: dict[int, int]) -> Finding:
        call = g.stuck_call
        op = call.op if call and call.op else "collective"
        site = f", called from {call.site}" if call and call.site else ""
        where = collectives.where_in_stacks(job, missing)
        who = collectives.rank_list(missing)
        lasts = sorted(set(missing.values()))
        last_txt = (f"stopped after #{lasts[0]}" if len(lasts) == 1 and lasts[0] > 0
                    else "issued none of it" if lasts == [0]
                    else f"stopped after #{', #'.join(map(str, lasts[:4]))}")
        summary = (f"{who[0].upper()}{who[1:]} never joined {op} #{g.stuck_at} of {g.label}: "
                   f"{collectives.rank_list(g.waiting)} wait in it{site}; {who} {last_txt}")
        summary += "."
        if where:
            summary += " " + "; ".join(f"Rank {r} is {w}" for r, w in sorted(where.items())[:3])
            summary += "."
        evidence: list[Evidence] = []
        for r in sorted(missing)[:2]:
            st = g.ranks[r]
            text = f"rank {r}: last collective of {g.label}: " + (
                st.last.describe() if st.last else "none")
            evidence.append(Evidence(path=st.source or "", line=None, text=text, rank=r,
                                     host=st.host))
            if r in where:
                evidence.append(Evidence(path=_stack_source(job, r), line=None, rank=r,
                                         text=f"rank {r} (stack dump) is {where[r]}"))
        for r in g.waiting[:1]:
            st = g.ranks[r]
            pending = st.pending or g.calls_at(g.stuck_at).get(r)
            evidence.append(Evidence(path=st.source or "", line=None, rank=r, host=st.host,
                                     text=f"rank {r}: " + (pending.describe() if pending else
                                                           f"issued #{st.last_issued}")))
        timeouts = [row for row in g.log_rows if row["kind"] in collectives.HANG_KINDS]
        evidence += [evidence_of(row) for row in timeouts[:1]]
        return self.finding(
            summary,
            evidence=evidence,
            ranks=missing,
            hosts=[g.ranks[r].host for r in missing],
            confidence=0.9 if report.stuck and where else 0.85 if report.stuck else 0.6,
            role=None if report.stuck else "info",
            ts=first_ts(timeouts),
            details={
                "process_group": g.name, "group_desc": g.desc, "collective": op,
                "sequence_number": g.stuck_at,
                "call_site": call.site_path if call else None,
                "waiting_ranks": g.waiting,
                "not_joined": {str(r): last for r, last in sorted(missing.items())},
                "last_call_sites": {str(r): g.ranks[r].last.site_path
                                    for r in sorted(missing) if g.ranks[r].last},
                "where": {str(r): w for r, w in sorted(where.items())},
                "stuck_because": report.stuck_because,
            },
        )


def _stack_source(job: Job, rank: int) -> str:
    rows = job.stacks.filter(job.stacks["rank"] == rank)["source"]
    return str(rows[0]) if rows.len() else ""
