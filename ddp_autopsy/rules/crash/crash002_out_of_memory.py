"""A rank ran out of GPU or host memory.

## What it detects
`torch.OutOfMemoryError: CUDA out of memory`, NCCL's "Cuda failure 'out of memory'", or the
kernel's OOM killer ("Out of memory: Killed process PID") for a training process.

## Why it hangs or kills the job
The rank that runs out of memory dies (or is killed without a traceback); the others block in
their next collective until the timeout, then fail with errors that only say a peer is gone.

## Evidence
The out-of-memory line with the rank, and how much it tried to allocate.

## Remedy
Lower the memory peak on that rank: smaller micro-batch, activation checkpointing, sharding
(FSDP/ZeRO), `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation; for the
host OOM killer, fewer DataLoader workers or less host-side caching. Ranks with uneven inputs
(longer sequences) need headroom for the largest batch.

## Example
```
[rank11]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB. GPU 3 has a total capacity of 63.42 GiB of which 1.70 GiB is free.
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, ranks_of, subject


class OutOfMemory(Rule):
    code = "CRASH002"
    slug = "out-of-memory"
    cause = "out_of_memory"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("oom")
        if not rows:
            return
        ranks = ranks_of(rows)
        tried = next((r["data"]["tried"] for r in rows if r["data"].get("tried")), None)
        kind = "host memory (OOM killer)" if any(r["data"].get("host") for r in rows) \
            else "GPU memory" if any("CUDA" in r["text"] for r in rows) else "memory"
        who = subject(ranks, "A rank")
        summary = f"{who} ran out of {kind}"
        summary += f" (tried to allocate {tried})." if tried else "."
        yield self.from_rows(rows, summary, shown=2, ranks=ranks, confidence=0.9,
                             details={"tried": tried, "kind": kind})
