"""Shared memory (/dev/shm) too small, not shared, or not writable.

## What it detects
NCCL's "Error while creating shared memory segment /dev/shm/nccl-XXXX (size N)", "failed to
extend /dev/shm/nccl-XXXX to N bytes, error: No space left on device (28)", "attaching to ...
No such file or directory" (ranks in different IPC namespaces), and the DataLoader's "This might
be caused by insufficient shared memory (shm)". Without such a line, a process killed by SIGBUS
(UCX's "Caught signal 7 (Bus error ...)", exit code -7) is reported at a lower confidence: a
full /dev/shm is how a training job most often gets a bus error.

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
            yield from self._sigbus(job)
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

    def _sigbus(self, job: Job) -> Iterator[Finding]:
        """A process killed by SIGBUS and no shared-memory error in the inputs: touching a page
        of a memory-mapped file that has no backing, and /dev/shm out of space is how a training
        job gets there (NCCL's and the DataLoader's segments live there)."""
        rows = [r for r in job.rows("native_signal") if r["data"].get("signum") == 7] + [
            r for r in job.rows("worker_failed", "worker_signal", "elastic_failure",
                                "mpi_process_exit")
            if r["data"].get("exitcode") == -7 or r["data"].get("signum") == 7
            or "SIGBUS" in str(r["data"].get("traceback", ""))] + [
            r for r in job.rows("exception") if "is killed by signal: Bus error" in r["text"]]
        if not rows:
            return
        ranks = ranks_of(rows)
        who = subject(ranks, "A process")
        yield self.from_rows(
            rows, f"{who} died of SIGBUS (a bus error): most likely /dev/shm is full or too "
            "small for NCCL's or the DataLoader's shared-memory segments (Docker's default is 64 "
            "MB; `df -h /dev/shm` in the container).", shown=2, ranks=ranks, confidence=0.55,
            hosts=[r["host"] or r["data"].get("host") for r in rows])
