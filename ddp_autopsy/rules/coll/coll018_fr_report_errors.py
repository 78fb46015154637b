"""PyTorch's Flight Recorder analyzer found ranks calling a collective differently.

## What it detects
The text report of `fr_trace` (PyTorch's Flight Recorder analyzer), pasted instead of the dumps
it read: a block headed "Collective sequence number: N has errors" (older releases: "Collective N
at entry M errors") with its "error msg: Culprit rank 22; Error type: SIZE_OR_SYNTAX_MISMATCH,
Expected input sizes: ... does not match found input sizes: ...", or "Input/output mismatch in
the collective sequence number: N" (an all-to-all whose sizes do not add up). The ranks the
message names differ from the first rank the analyzer read; they are named as the ranks that
differ (the analyzer's "culprit" is only relative to that first rank).

## Why it hangs or kills the job
Collectives pair by order: a rank that calls another collective, or the same one with other
sizes or dtypes, pairs its call with the others' different call; they wait, or exchange data of
the wrong size.

## Evidence
The report's header line and its error message.

## Remedy
Compare the named ranks' call with the others' at that sequence number (the analyzer prints each
entry's stack): a collective under a rank-dependent branch, data-dependent shapes, a dtype that
differs. Pass the Flight Recorder dumps themselves to `ddp-autopsy analyze` for every rank's view.

## Example
```
Collective sequence number: 39 has errors
group info: 0:default_pg
collective: nccl:all_reduce
input sizes: [[1025]]
error msg: Culprit rank 22; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: '[[1025]]' does not match found input sizes: '[[262144]]'
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, rank_phrase
from ddp_autopsy.rules.coll.coll017_fr_report_missing_ranks import fr_report_block

CULPRIT = re.compile(r"Culprit rank (\d+); Error type: (\w+)")


class FrReportErrors(Rule):
    code = "COLL018"
    slug = "fr-report-errors"
    cause = "collective_mismatch"

    def check(self, job: Job) -> Iterator[Finding]:
        found = fr_report_block(job, "error_seq", "io_seq")
        if found is None:
            return
        seq, head, rows = found
        msg = next((r for r in rows if r["data"].get("errors")), None)
        pairs = CULPRIT.findall(msg["data"]["errors"]) if msg else []
        ranks = sorted({int(r) for r, _ in pairs})
        kinds = sorted({k for _, k in pairs})
        what = (f": {rank_phrase(ranks)} differ{'s' if len(ranks) == 1 else ''} from the "
                f"others ({', '.join(k.lower().replace('_', ' ') for k in kinds)})"
                if ranks else ": the sizes the ranks gave do not add up")
        yield self.finding(
            f"At collective #{seq} the ranks called it differently, by the Flight Recorder "
            f"analyzer's report{what}.",
            evidence=[evidence_of(head), *([evidence_of(msg)] if msg else [])], ranks=ranks,
            confidence=0.75 if ranks else 0.6, details={"seq": seq, "errors": kinds})
