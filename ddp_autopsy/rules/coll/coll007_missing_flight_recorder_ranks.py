"""Ranks of a stuck group left no usable Flight Recorder dump, or never joined the group.

## What it detects
The Flight Recorder dumps of the other ranks show a process group waiting in a collective, and
some of its members left no usable dump: no file at all, an empty file, a truncated or corrupt
one — or a dump without a single collective of a group in which the others issued many (the
rank never joined that group). Membership comes from the dumps' `pg_config`, the world size, or
the rank numbering.

## Why it hangs or kills the job
A rank that produced no dump usually did not reach the dump: it was killed (OOM killer,
SIGKILL), is wedged (a GIL or CUDA deadlock, a dead TCPStore so the dump signal never arrived)
or was never started. The others wait for it in the collective until the timeout. A rank
without any collective of a group never created or entered that group.

## Evidence
The dumps present (their ranks and the collective they wait in) and the dump files that are
missing, empty or unreadable. When the present dumps account for every other member and all of
them joined the pending collective, the ranks without a dump are the only suspects and the
finding is more certain; when nothing shows the job was stuck, it is information about the input.

## Remedy
Look at those ranks' logs and hosts: an OOM kill (`dmesg`), a crash before the dump, a node that
never started. Make dumps reliable: `TORCH_FR_DUMP_TEMP_FILE` on a shared filesystem,
`TORCH_NCCL_DUMP_ON_TIMEOUT=1`, or take them on demand with `ddp-autopsy collect` while the job
hangs.

## Example
```
# Flight Recorder dumps, one line per rank (see flight_recorder.example_dumps)
rank 0: #1 all_reduce [[4]] Float completed | #2 all_reduce [[4]] Float timed-out
rank 1: #1 all_reduce [[4]] Float completed | #2 all_reduce [[4]] Float timed-out
rank 2: empty dump
rank 3: #1 all_reduce [[4]] Float completed | #2 all_reduce [[4]] Float timed-out
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer import collectives
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding
from ddp_autopsy.rules.coll._flight_recorder import FlightRecorderRule


class MissingFlightRecorderRanks(FlightRecorderRule):
    code = "COLL007"
    slug = "missing-flight-recorder-ranks"
    cause = "missing_ranks"

    def check(self, job: Job) -> Iterator[Finding]:
        report = job.collective_report
        problems = _dump_problems(report)
        for g in report.groups:
            if not g.fr or not (g.no_dump or g.never_joined_any):
                continue
            yield self._finding(report, g, problems)

    def _finding(self, report: collectives.CollectiveReport, g: collectives.GroupTimeline,
                 problems: dict[int, tuple[str, str]]) -> Finding:
        absent = sorted(g.no_dump)
        empty_group = sorted(g.never_joined_any)
        parts = []
        if absent:
            why = "; ".join(f"rank {r}: {problems[r][0]}" if r in problems else f"rank {r}: no file"
                            for r in absent[:4])
            parts.append(f"{collectives.rank_list(absent)} left no usable Flight Recorder dump "
                         f"({why}{'; …' if len(absent) > 4 else ''})")
        if empty_group:
            parts.append(f"{collectives.rank_list(empty_group)} recorded no collective of this "
                         "group")
        waiting = g.waiting or [r for r, s in g.ranks.items() if s.has_dump and s.last_issued]
        call = g.stuck_call
        context = (f"{collectives.rank_list(g.waiting)} wait in {call.op if call else 'it'} "
                   f"#{g.stuck_at}" if g.stuck_at is not None and g.waiting
                   else f"{collectives.rank_list(waiting)} recorded its collectives")
        summary = f"In {g.label}, {' and '.join(parts)} while {context}."
        others_accounted = not g.not_joined or set(g.not_joined) <= set(empty_group)
        stuck = report.stuck and g.stuck_at is not None
        evidence = [Evidence(path=problems[r][1], line=None, rank=r,
                             text=f"rank {r}: {problems[r][0]}")
                    for r in absent if r in problems][:2]
        for r in waiting[:1]:
            st = g.ranks[r]
            pending = st.pending or (g.calls_at(g.stuck_at).get(r) if g.stuck_at else None)
            evidence.append(Evidence(path=st.source or "", line=None, rank=r, host=st.host,
                                     text=f"rank {r}: " + (pending.describe() if pending
                                                           else f"issued #{st.last_issued}")))
        return self.finding(
            summary,
            evidence=evidence,
            ranks=[*absent, *empty_group],
            confidence=(0.75 if others_accounted else 0.5) if stuck else 0.4,
            role=None if stuck else "info",
            details={"process_group": g.name, "group_desc": g.desc, "members": g.members,
                     "members_from": g.members_from, "no_dump": absent,
                     "dump_problems": {str(r): problems[r][0] for r in absent if r in problems},
                     "never_joined_group": empty_group, "stuck_at": g.stuck_at,
                     "waiting_ranks": g.waiting},
        )


def _dump_problems(report: collectives.CollectiveReport) -> dict[int, tuple[str, str]]:
    """Rank → (what is wrong with its dump, the file) for dumps that exist but are unusable."""
    out: dict[int, tuple[str, str]] = {}
    dumps = report.dumps
    if dumps.height == 0 or "status" not in dumps.columns:
        return out
    for row in dumps.filter(~dumps["status"].is_in(["ok", "duplicate"])).iter_rows(named=True):
        if row["rank"] is None:
            continue
        what = {"empty": "empty file", "corrupt": "unreadable", "unsafe": "refused (not plain "
                "data)", "not_a_dump": "not a dump"}.get(row["status"], row["status"])
        if row["error"] and row["status"] != "empty":
            what += f": {row['error'][:120]}"
        out[row["rank"]] = (what, row["source"])
    return out
