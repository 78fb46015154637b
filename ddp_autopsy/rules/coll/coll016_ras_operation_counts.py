"""NCCL's RAS report: the ranks of a communicator launched different numbers of a collective.

## What it detects
The status report of NCCL's RAS service (`ncclras`, NCCL 2.24+) for a hung job: "Communicator
ranks have different AllGather operation counts", then each count with how many ranks reached
it ("30 ranks have launched up to operation 640", "2 ranks have launched up to operation 641"),
and the ranks of the smaller groups ("Rank 12 -- GPU 4 managed by process 323032 on node ...",
or "Rank 5 has launched up to operation 639 -- GPU ..." for a rank alone). The ranks with the
lowest count never launched the operation the others wait in: they are named (listed, or every
rank of the communicator but the listed ones when the report lists the ranks ahead).

## Why it hangs or kills the job
A collective completes only when every rank of the communicator launches it. The ranks ahead
wait in operation N+1 for the ranks still before it, which are busy elsewhere, stuck, or took a
path that skips it.

## Evidence
The report's mismatch line, its count lines and the listed ranks.

## Remedy
Look at what the ranks that are behind are doing (`py-spy dump` on their processes, or
`ddp-autopsy collect` on their nodes): rank-local work, a data loader, a branch that skips a
collective. If the ranks ahead are few, check whether they issue a collective the others do not.

## Example
```
#0-0 (fa93daea854b060b) MISMATCH
  Communicator ranks have different AllGather operation counts
  30 ranks have launched up to operation 640
  2 ranks have launched up to operation 641
  Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124
  Rank 13 -- GPU 5 managed by process 323033 on node 10.137.190.124
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, rank_phrase


def _groups(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The report's blocks, one per mismatch line, in file order."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for r in sorted(rows, key=lambda r: (r["source"], r["line"])):
        if r["data"].get("op"):
            out.append((r["data"]["op"], []))
        elif out:
            out[-1][1].append(r)
    return out


class RasOperationCounts(Rule):
    code = "COLL016"
    slug = "ras-operation-counts"
    cause = "rank_stuck_outside_collective"

    def check(self, job: Job) -> Iterator[Finding]:
        blocks = _groups(job.rows("ras_op_counts"))
        for op, rows in blocks:
            # value -> (ranks counted, ranks listed); a line's listed ranks follow its count line
            counts: dict[int, int] = {}
            listed: dict[int, set[int]] = {}
            current: int | None = None
            for r in rows:
                d = r["data"]
                value = 0 if "none" in d else d.get("value")
                if d.get("count") is not None:
                    current = value
                    counts[value] = d["count"]
                elif d.get("crank") is not None:
                    if d.get("value") is not None or "none" in d:  # a rank alone in its group
                        current = value
                        counts[value] = 1
                    if current is not None:
                        listed.setdefault(current, set()).add(d["crank"])
            if len(counts) < 2:
                continue
            low = min(counts)
            total = sum(counts.values())
            if listed.get(low):
                behind = listed[low]
            elif listed and all(len(listed.get(v, ())) == counts[v] for v in counts if v != low):
                # the report listed every rank ahead: the rest of the communicator is behind
                ahead = set().union(*listed.values())
                behind = set(range(total)) - ahead if max(ahead) < total else set()
            else:
                behind = set()
            who = rank_phrase(behind, empty=f"{counts[low]} rank{'s' if counts[low] > 1 else ''}")
            yield self.from_rows(
                rows[:4], f"{who[0].upper()}{who[1:]} launched {op} only up to operation {low}"
                f" while {total - counts[low]} other rank{'s' if total - counts[low] > 1 else ''}"
                f" reached operation {max(counts)} (NCCL's RAS report): those behind never "
                "launched the collective the others wait in.", shown=4, ranks=behind,
                confidence=0.7 if behind else 0.5,
                details={"op": op, "counts": {str(v): n for v, n in sorted(counts.items())}})
            return
