"""The ranks built different models: DDP's construction-time check failed.

## What it detects
`DistributedDataParallel` compares the parameters of every rank's model when it is built
(`_verify_param_shape_across_processes`): "DDP expects same model across all ranks, but Rank 2 has
6 params, while rank 0 has inconsistent 4 params", or, for a parameter of another shape or
memory layout, "... appears not to match sizes (strides) of the same param in process 0". For
the count, each rank names the first rank that differs from it; the rank whose count the others
do not share, or that two reports name, or whose model has no parameters at all, is the odd one
(one report alone names no rank otherwise: either side of it may be). The sizes and strides
checks compare every rank with rank 0 ("... in process 0"): their reporters are the odd ones
when another rank is seen passing, rank 0 when every other rank of the world reported.

## Why it hangs or kills the job
DDP all-reduces gradients bucket by bucket in parameter order: ranks with different parameters
would reduce different tensors into each other, so it refuses to start, and every rank exits.

## Evidence
The ranks' reports and the parameter count of each.

## Remedy
Build the same model on every rank: look for model code that depends on the rank or on the
host (a feature flag read from the environment, a config file that differs between nodes, layers
added only where a checkpoint exists, a different library version), and for parameters created
after the model was wrapped.

## Example
```
[rank2]: RuntimeError: DDP expects same model across all ranks, but Rank 2 has 6 params, while rank 0 has inconsistent 4 params.
[rank0]: RuntimeError: DDP expects same model across all ranks, but Rank 0 has 4 params, while rank 2 has inconsistent 6 params.
[rank1]: RuntimeError: DDP expects same model across all ranks, but Rank 1 has 4 params, while rank 2 has inconsistent 6 params.
```
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, rank_phrase


class DdpModelMismatch(Rule):
    code = "ENV006"
    slug = "ddp-model-mismatch"
    cause = "config_mismatch"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("ddp_model_mismatch")
        if not rows:
            return
        params: dict[int, int] = {}  # rank -> its parameter count, as the reports give it
        named: Counter[int] = Counter()  # ranks the reports call inconsistent
        shapes = [r for r in rows if r["data"].get("what")]
        for r in rows:
            d = r["data"]
            if d.get("what"):
                continue  # (a sizes/strides report: every rank compares with rank 0's)
            if "r1" in d and "n1" in d:
                params.setdefault(d["r1"], d["n1"])
            if "r2" in d:
                named[d["r2"]] += 1
                if "n2" in d:
                    params.setdefault(d["r2"], d["n2"])
        counts = Counter(params.values())
        odd: list[int] = []
        if len(counts) > 1:
            (common, n), *rest = counts.most_common()
            if rest and n > rest[0][1]:
                odd = sorted(rank for rank, p in params.items() if p != common)
        if not odd and named:
            # (each rank names the first rank that differs from it: one report alone cannot
            # say which of the two is the odd one, two reports naming one rank can)
            (rank, votes), *rest = named.most_common()
            odd = [rank] if votes >= 2 and (not rest or votes > rest[0][1]) else []
        empty = [rank for rank, p in params.items() if p == 0]
        if not odd and len(empty) == 1 and len(params) > 1:
            odd = empty  # (a model with no parameters at all is the one that went wrong)
        if not odd and shapes:
            odd = _odd_by_shape(job, shapes)
        what = (f"{rank_phrase(odd)} built a different model than the others" if odd
                else "The ranks built different models")
        sizes = ", ".join(f"rank {r}: {p}" for r, p in sorted(params.items()))
        strides = all(r["data"].get("what") == "strides" for r in rows)
        yield self.finding(
            f"{what[0].upper()}{what[1:]}: DDP's check of the parameters failed at construction"
            + (f" (parameters per rank: {sizes})." if sizes else
               " (a parameter's strides differ: the same shapes in another memory format, "
               "channels_last on some ranks, or a tensor loaded into it on some ranks only)."
               if strides else "."),
            evidence=[evidence_of(r) for r in sorted(
                rows, key=lambda r: r["rank"] not in odd)[:2]],
            ranks=odd, confidence=0.9, ts=first_ts(rows),
            details={"params": {str(k): v for k, v in sorted(params.items())}})


def _odd_by_shape(job: Job, shapes: list[dict]) -> list[int]:
    """The sizes and strides checks compare every rank's parameters with rank 0's broadcast
    ("... of the same param in process 0"): the reporters differ from rank 0. They are the odd
    ones when another rank, not rank 0, is seen without such a report; rank 0 is when every
    other rank of the world reported; else no rank can be named."""
    reporters = {r["rank"] for r in shapes if r["rank"] is not None}
    if not reporters:
        return []
    seen = set(job.ranks["rank"].to_list()) if job.ranks.height else set()
    if seen - reporters - {0}:
        return sorted(reporters)
    world = job.world_size
    if world and reporters == set(range(1, world)):
        return [0]
    return []
