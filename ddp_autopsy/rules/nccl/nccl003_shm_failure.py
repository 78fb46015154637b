"""Shared memory (/dev/shm) too small, not shared, or not writable.

## What it detects
NCCL's "Error while creating shared memory segment /dev/shm/nccl-XXXX (size N)", "failed to
extend /dev/shm/nccl-XXXX to N bytes, error: No space left on device (28)", "attaching to ...
No such file or directory" (ranks in different IPC namespaces), "unlink shared memory ... failed,
error: No such file or directory" (the segment removed under the job: systemd's RemoveIPC), and
the DataLoader's "This might
be caused by insufficient shared memory (shm)". Without such a line, a process killed by SIGBUS
(UCX's "Caught signal 7 (Bus error ...)", exit code -7) is reported at a lower confidence: a
full /dev/shm is how a training job most often gets a bus error. NCCL's shared-memory transport
failing with no segment error of its own is reported too: its header's CUDA call ("include/shm.h:42
NCCL WARN Cuda failure 'invalid argument'", registering the segment, NCCL <= 2.6) or an error trail
through transport/shm.cc. At a low confidence, a bare "unhandled system error" (NCCL's own
lines not in the inputs) of a job the inputs show on one host.

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

import re
from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, rank_phrase, ranks_of, subject
from ddp_autopsy.rules.nccl.nccl005_nccl_connection_failure import across_hosts, bare_system_error


class ShmFailure(Rule):
    code = "NCCL003"
    slug = "shm-failure"
    cause = "shm_failure"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("shm_error")
        if not rows:
            found = list(self._shm_transport(job)) or list(self._sigbus(job))
            yield from found or self._bare_system_error(job)
            return
        texts = " ".join(r["text"] for r in rows)
        if "attaching to" in texts and "No such file" in texts:
            why = "is not shared between the ranks (separate IPC namespaces or containers)"
        elif all("unlink shared memory" in r["text"] for r in rows) and "No such file" in texts:
            ranks = ranks_of(rows)
            yield self.from_rows(
                rows, f"NCCL's shared-memory segments in /dev/shm were removed under "
                f"{rank_phrase(ranks) if ranks else 'the job'} while it ran (NCCL found them "
                "gone when it unlinked them): most often systemd-logind's RemoveIPC=yes, when "
                "the user's last login session ends (set RemoveIPC=no in "
                "/etc/systemd/logind.conf), or a /dev/shm cleanup job.", shown=2, ranks=ranks,
                confidence=0.8)
            return
        elif "No space left" in texts or "creating" in texts or "extend" in texts:
            why = "is too small"
        else:
            why = "failed"
        ranks = ranks_of(rows)
        who = subject(ranks, "A rank")
        yield self.from_rows(
            rows, f"Shared memory (/dev/shm) {why}: {who} could not set up its shared-memory "
            "segments.", shown=2, ranks=ranks, confidence=0.9)

    def _shm_transport(self, job: Job) -> Iterator[Finding]:
        """NCCL's shared-memory transport failing to set a connection up with no segment error
        of its own: a CUDA call in its shm header ("include/shm.h:42 NCCL WARN Cuda failure
        'invalid argument'": registering the /dev/shm segment with CUDA, NCCL <= 2.6) or an error
        trail through transport/shm.cc. The segment exists but CUDA cannot map it, or the
        transport cannot create it."""
        warns = [r for r in job.rows("cuda_failure") if SHM_SOURCE.search(r["text"])]
        trail = [r for r in job.rows("nccl_error_trace")
                 if SHM_TRAIL.search(str(r["data"].get("file", "")))]
        if not warns and not trail:
            return
        rows = warns or trail
        ranks = ranks_of(rows)
        who = rank_phrase(ranks) if ranks else "a rank"
        yield self.from_rows(
            [*warns[:1], *trail[:1]],
            f"NCCL's shared-memory transport failed: {who} could not set up its /dev/shm "
            "connection to a peer on the same node"
            + (f" ({warns[0]['data'].get('err')})" if warns and warns[0]["data"].get("err")
               else "") + ".", shown=2, ranks=ranks, confidence=0.6)

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


    def _bare_system_error(self, job: Job) -> Iterator[Finding]:
        """A bare ncclSystemError (NCCL's own lines not in the inputs) of a job the inputs show
        on one host: there, the system call that fails is most often /dev/shm's (Docker's 64 MB
        default); NCCL005's when they show more than one host or NCCL's sockets failing."""
        rows, sockets = bare_system_error(job)
        if not rows or sockets or across_hosts(job):
            return
        yield self.from_rows(
            rows, "NCCL failed a system call (unhandled system error), printed nothing else the "
            "inputs show, and the inputs show one host: there the call that fails is most often "
            "the one setting up NCCL's shared memory in /dev/shm (Docker's 64 MB default is too "
            "small). Between hosts it is a connection: run with NCCL_DEBUG=INFO to see which.",
            shown=2, confidence=0.35, details={"estr": rows[0]["data"].get("estr")})


#: Where NCCL's shared-memory transport reports from: its header's CUDA call (<= 2.6) ...
SHM_SOURCE = re.compile(r"\binclude/shm\.h:\d+ NCCL WARN")
#: ... and its source in an error trail.
SHM_TRAIL = re.compile(r"(?:^|/)transport/shm\.(?:cc|cu)$|(?:^|/)shmutils\.cc$")
