"""PyTorch's Flight Recorder analyzer says some ranks never joined a collective.

## What it detects
The text report of `fr_trace` (PyTorch's Flight Recorder analyzer, `torch.distributed.
flight_recorder`), pasted instead of the dumps it read: a block headed "Not all ranks joining
collective, sequence number: N" (older releases: "Not all ranks joining collective: sequence
number: N"), with its "missing ranks: {3, 4, 5, 6, 7}". The ranks missing from the earliest such
collective are named: they never entered it.

## Why it hangs or kills the job
A collective completes only when every rank of its group enters it; the ranks the analyzer found
in it wait there for the missing ones, which were busy elsewhere or stuck.

## Evidence
The report's header line and its "missing ranks" line.

## Remedy
Look at what the missing ranks were doing when the others entered the collective: their stacks
(`ddp-autopsy collect`, or the "collective stack trace" of the entries the analyzer printed), or
pass the Flight Recorder dumps themselves to `ddp-autopsy analyze`.

## Example
```
Not all ranks joining collective, sequence number: 31117
internal record id: 31116
group info: 0:default_pg
collective: nccl:all_reduce
missing ranks: {3, 4, 5, 6, 7}
world size: 8
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.ranksets import parse_ranks
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, rank_phrase

HEADS = ("missing_seq", "error_seq", "io_seq")


def fr_report_block(job: Job, *heads: str) -> tuple[int, dict, list[dict]] | None:
    """The earliest block of the analyzer's report whose header carries one of ``heads``: its
    sequence number, header row and the rows after it up to the next header (what came after
    that collective follows from it)."""
    block: tuple[int, dict, list[dict]] | None = None
    for r in sorted(job.rows("fr_report"), key=lambda r: (r["source"], r["line"])):
        d = r["data"]
        if any(d.get(k) is not None for k in HEADS):
            if block is not None:
                return block
            seq = next((d[k] for k in heads if d.get(k) is not None), None)
            block = (seq, r, []) if seq is not None else None
        elif block is not None and block[1]["source"] == r["source"]:
            block[2].append(r)
    return block


class FrReportMissingRanks(Rule):
    code = "COLL017"
    slug = "fr-report-missing-ranks"
    cause = "rank_stuck_outside_collective"

    def check(self, job: Job) -> Iterator[Finding]:
        found = fr_report_block(job, "missing_seq")
        missing = next((r for r in found[2] if r["data"].get("missing")), None) if found else None
        if found is None or missing is None:
            return
        seq, head, _ = found
        ranks = sorted(parse_ranks(missing["data"]["missing"]))
        yield self.finding(
            f"{rank_phrase(ranks).capitalize()} never joined collective #{seq}, by the Flight "
            "Recorder analyzer's report: the other ranks entered it and waited.",
            evidence=[evidence_of(head), evidence_of(missing)], ranks=ranks,
            confidence=0.8, details={"seq": seq, "missing": ranks})
