"""DDP found parameters that got no gradient.

## What it detects
DistributedDataParallel's "Expected to have finished reduction in the prior iteration before
starting a new one ... your module has parameters that were not used in producing loss", with
the parameter names from "Parameters which did not receive grad for rank N: ..." when
TORCH_DISTRIBUTED_DEBUG is INFO or DETAIL.

Also the reducer's converse complaint: "Expected to mark a variable ready only once" /
"Parameter at index N [with name X] has been marked as ready twice": one parameter's gradient
hook fired twice in an iteration (a reentrant backward such as activation checkpointing with
`use_reentrant=True`, a parameter used outside `forward`, a module run twice per step).

## Why it hangs or kills the job
DDP all-reduces gradients bucket by bucket as they become ready; a parameter that takes no part
in the loss never gets a gradient, its bucket is never reduced, and the next iteration fails
(or, when the unused set differs between ranks, the ranks hang in mismatched all-reduces).

## Evidence
The error and the parameters (and rank) that received no gradient.

## Remedy
Make every parameter take part in the loss on every rank, or pass
`find_unused_parameters=True` to DistributedDataParallel (some overhead), or freeze the unused
parameters (`requires_grad_(False)`); set `static_graph=True` when the unused set never
changes. For a parameter marked ready twice: checkpoint with `use_reentrant=False` (or
`model._set_static_graph()` / `static_graph=True` when the graph is the same every step), and
run each module once per forward.

## Example
```
RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss.
Parameters which did not receive grad for rank 3: mask_encoder.sensory_update.transform.bias, mask_encoder.sensory_update.transform.weight
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, rank_phrase


class UnusedParameters(Rule):
    code = "COLL003"
    slug = "unused-parameters"
    cause = "unused_parameters"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("unused_parameters")
        if not rows:
            yield from self._ready_twice(job)
            return
        params: list[str] = []
        ranks: set[int] = set()
        for r in rows:
            d = r["data"]
            if "params" in d:
                ranks.add(d["rank"])
                params += [p.strip() for p in d["params"].split(",") if p.strip()]
            elif r["rank"] is not None:
                ranks.add(r["rank"])
        who = rank_phrase(ranks)
        names = ", ".join(sorted(set(params))[:6])
        summary = f"Parameters got no gradient on {who}" if ranks else \
            "DDP found parameters that got no gradient"
        summary += f": {names}." if names else "."
        best = sorted(rows, key=lambda r: "params" not in r["data"])
        yield self.finding(summary, evidence=[evidence_of(r) for r in best[:2]], ranks=ranks,
                           confidence=0.9, ts=first_ts(rows),
                           details={"parameters": sorted(set(params))})

    def _ready_twice(self, job: Job) -> Iterator[Finding]:
        """The reducer's converse complaint: one parameter's gradient hook fired twice in an
        iteration."""
        rows = job.rows("ddp_ready_twice")
        if not rows:
            return
        ranks = {r["rank"] for r in rows if r["rank"] is not None}
        names = sorted({r["data"]["param"] for r in rows if r["data"].get("param")})
        what = f" ({', '.join(names[:3])})" if names else ""
        best = sorted(rows, key=lambda r: "index" not in r["data"])
        yield self.finding(
            f"DDP saw a parameter{what} marked ready twice in one iteration"
            f"{' on ' + rank_phrase(ranks) if ranks else ''}: its gradient hook fired twice, "
            "most often from a reentrant backward (activation checkpointing with "
            "use_reentrant=True under DDP), a parameter used outside forward, or a module run "
            "twice in one step, which DDP's bucket bookkeeping cannot follow.",
            evidence=[evidence_of(r) for r in best[:2]], ranks=ranks, confidence=0.85,
            ts=first_ts(rows), details={"parameters": names})
