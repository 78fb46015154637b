"""Ranks recorded different collectives at the same point (Flight Recorder).

## What it detects
The first collective of a process group that the ranks' Flight Recorder dumps disagree about:
at the same sequence number, some ranks ran another operation (broadcast where the others ran
all_reduce), other sizes or dtypes, or the same operation from another line of code (rank 1's
collective #6 is its loss all_reduce while the others' #6 is the gradient-norm all_reduce: it
skipped one). The ranks off the majority are named; on a tie, all are.

## Why it hangs or kills the job
Collectives are matched by order, not by name. A rank that skips, adds or reorders one pairs
the wrong collectives from then on: with different shapes the job errors or hangs; with equal
shapes it silently combines unrelated tensors and hangs later, when the ranks run out of
partners. The timeout or error shows up far from the cause; the first divergence is the cause.

## Evidence
Each rank's Flight Recorder entry at that sequence number: operation, input/output sizes and
dtypes, and (pickle dumps) the call site. Sizes are not compared where they legitimately differ
(all_to_all, gather, scatter, coalesced groups), and a state difference (completed on some
ranks, scheduled on others) is how a hang looks, not a disagreement. When the culprit's following
collectives equal the others' shifted by one or two, it skipped (or added) collectives, and the
summary says so. Ranks may call the same collective from different lines on purpose (the root
of a broadcast in a branch of its own), so a difference only in call sites is a root cause only
with that shift in a stuck job; otherwise it is information.

## Remedy
Make every rank issue the same collectives in the same order with the same shapes and dtypes:
look at the culprit's code between its previous collective and this one for rank- or
data-dependent control flow (`if rank == 0:`, an early `continue`/`break`, a skipped batch,
`dist.reduce` where every rank needs the result) and for per-rank tensor shapes.

## Example
```
# Flight Recorder dumps, one line per rank (see flight_recorder.example_dumps)
rank 0: #1 all_reduce [[4]] Float completed | #2 all_reduce [[4]] Float timed-out
rank 1: #1 all_reduce [[4]] Float completed | #2 broadcast [[4]] Float timed-out
rank 2: #1 all_reduce [[4]] Float completed | #2 all_reduce [[4]] Float timed-out
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer import collectives
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding
from ddp_autopsy.rules.coll._flight_recorder import FlightRecorderRule


class CollectiveDivergence(FlightRecorderRule):
    code = "COLL006"
    slug = "collective-divergence"
    cause = "collective_mismatch"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        report = job.collective_report
        for g in report.groups:
            d = g.divergence
            if d is None:
                continue
            yield self._finding(job, report, g, d)

    def _finding(self, job: Job, report: collectives.CollectiveReport,
                 g: collectives.GroupTimeline, d: collectives.Divergence) -> Finding:
        odd, usual = d.summary()
        who = collectives.rank_list(d.culprits)
        others = collectives.rank_list(set(d.calls) - set(d.culprits))
        if d.majority and usual:
            verb = {"op": "called", "sizes": "called", "dtypes": "called",
                    "call site": "issued it from"}[d.aspect]
            what = f"{who} {verb} {odd} where {others} {verb} {usual}"
        else:
            values = "; ".join(f"rank {r}: {d.value(c)}" for r, c in sorted(d.calls.items())[:4])
            what = f"the ranks disagree ({values})"
        summary = f"Ranks diverge at collective #{d.seq} of {g.label}: {what}."
        if d.shift is not None:
            how = {1: "skipped a collective", 2: "skipped two collectives",
                   -1: "issued an extra collective", -2: "issued two extra collectives"}[d.shift]
            sign = "+" if d.shift > 0 else "-"
            summary += (f" {who[0].upper()}{who[1:]} {how} just before: from #{d.seq} on, its "
                        f"collective #n is the others' #n{sign}{abs(d.shift)}.")
        where = collectives.where_in_stacks(job, d.culprits) if report.stuck else {}
        if where:
            summary += " Now " + "; ".join(f"rank {r} is {w}" for r, w in sorted(where.items())[:2])
            summary += "."
        evidence = []
        shown = [*d.culprits[:2], *[r for r in sorted(d.calls) if r not in d.culprits][:1]]
        for r in shown:
            call = d.calls[r]
            evidence.append(Evidence(path=call.source or "", line=None, rank=r, host=call.host,
                                     text=f"rank {r}: {call.describe()}"))
        # Ranks may issue the same collective from different lines on purpose (the root of a
        # broadcast in its own branch): a call-site difference is a cause only when the
        # culprit's sequence is the others' shifted, or when the job was stuck.
        site_only = d.aspect == "call site"
        weak = site_only and d.shift is None
        confidence = (0.9 if d.majority else 0.75) - (0.15 if weak else 0.0)
        return self.finding(
            summary,
            evidence=evidence,
            ranks=d.culprits,
            hosts=[d.calls[r].host for r in d.culprits],
            confidence=confidence,
            role="info" if weak or (site_only and not report.stuck) else None,
            details={
                "process_group": g.name, "group_desc": g.desc, "sequence_number": d.seq,
                "aspect": d.aspect, "majority": d.majority, "shift": d.shift,
                "calls": {str(r): {"op": c.op, "input_sizes": c.input_sizes,
                                   "input_dtypes": c.input_dtypes,
                                   "output_sizes": c.output_sizes,
                                   "output_dtypes": c.output_dtypes, "state": c.state,
                                   "call_site": c.site_path}
                          for r, c in sorted(d.calls.items())[:64]},
            },
        )
