"""Shared memory (/dev/shm) too small, not shared, or not writable.

## What it detects
NCCL's "Error while creating shared memory segment /dev/shm/nccl-XXXX (size N)", "failed to
extend /dev/shm/nccl-XXXX to N bytes, error: No space left on device (28)", "attaching to ...
No such file or directory" (ranks in different IPC namespaces), and the DataLoader's "This might
be caused by insufficient shared memory (shm)".

## Why it hangs or kills the job
NCCL's intra-node transport and the DataLoader's worker queues live in /dev/shm. When it is
too small (Docker's default is 64 MB) or not shared between the ranks' containers, setup fails
or a process later dies with SIGBUS, and the others wait for it.

## Evidence
The shared-memory error line, with the segment path, size and errno.

## Remedy
Give the container more shared memory (`docker run --shm-size=8g`, a Kubernetes `emptyDir`
with `medium: Memory` on /dev/shm), share the IPC namespace between ranks (`--ipc=host`), or
as a workaround `NCCL_SHM_DISABLE=1` (slower).

## Example
```
  torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
  Last error:
  Error while creating shared memory segment /dev/shm/nccl-1YsMbG (size 7340384)
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, ranks_of, subject


class ShmFailure(Rule):
    code = "NCCL003"
    slug = "shm-failure"
    cause = "shm_failure"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("shm_error")
        if not rows:
            return
        texts = " ".join(r["text"] for r in rows)
        if "attaching to" in texts and "No such file" in texts:
            why = "is not shared between the ranks (separate IPC namespaces or containers)"
        elif "No space left" in texts or "creating" in texts or "extend" in texts:
            why = "is too small"
        else:
            why = "failed"
        ranks = ranks_of(rows)
        who = subject(ranks, "A rank")
        yield self.from_rows(
            rows, f"Shared memory (/dev/shm) {why}: {who} could not set up its shared-memory "
            "segments.", shown=2, ranks=ranks, confidence=0.9)
