"""The process-group backend cannot handle the tensors' device.

## What it detects
Collectives on tensors the backend does not support: NCCL with CPU tensors ("No backend type
associated with device type cpu", older "Tensors must be CUDA and dense"), Gloo with CUDA
tensors for an op it only has on CPU ("ProcessGroupGloo::reduce_scatter: unsupported device
type cuda"), the MPI backend with CUDA tensors and an MPI that is not CUDA-aware ("CUDA tensor
detected and the MPI used doesn't have CUDA-aware MPI support"), the NCCL backend on a build
without it, init_process_group with no backend on an accelerator torch has none for ("We
detected accelerator mps on your machine. But we don't know which communication backend to
use"), or a collective the backend does not implement at all ("Backend gloo does not
support alltoall", c10d's Backend.hpp; "ProcessGroup gloo does not support ..." before 2.0).

## Why it hangs or kills the job
The collective raises on the ranks that call it with the wrong device; the other ranks wait in
it until the timeout.

## Evidence
The error line and its rank.

## Remedy
Move the tensor to the backend's device before the collective (`t.cuda()` for NCCL, `t.cpu()`
for Gloo), or initialise both: `init_process_group("cpu:gloo,cuda:nccl")`; use the Gloo
backend on machines without GPUs.

## Example
```
[rank0]: RuntimeError: No backend type associated with device type cpu
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, ranks_of, subject

#: A Windows install's path in a line or a traceback frame ("C:\\...\\site-packages\\"; JSON
#: doubles the backslashes of a frame's file).
WINDOWS_PATH = r"(?i)\b[a-z]:(?:\\{1,2}[^\\\s\"]+)*\\{1,2}(?:site-packages|lib|scripts)\\"


class BackendDeviceMismatch(Rule):
    code = "ENV003"
    slug = "backend-device-mismatch"
    cause = "backend_device_mismatch"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("backend_device_mismatch")
        if not rows:
            return
        ranks = ranks_of(rows)
        d = rows[0]["data"]
        device = d.get("device") or \
            ("cpu" if d.get("need") == "CUDA" else "cuda" if d.get("need") else None)
        what = f"tensors on {device}" if device else "tensors"
        who = subject(ranks, "A rank")
        if any("NCCL built in" in r["text"] for r in rows):
            # Windows wheels have CUDA but never NCCL: their paths say which build it is
            windows = any(job.events[col].str.contains(WINDOWS_PATH).any()
                          for col in ("text", "data")) if job.events.height else False
            why = ("(Windows builds of PyTorch have no NCCL): use the gloo backend, or run "
                   "under WSL2 or Linux" if windows else "(no CUDA): use Gloo on CPU-only machines")
            yield self.finding(
                f"{subject(ranks, 'The job')} asked for the NCCL backend, which this torch build "
                f"does not have {why}.",
                evidence=[evidence_of(r) for r in rows[:2]], ranks=ranks, confidence=0.9,
                ts=first_ts(rows), details={"device": "cpu"})
            return
        if any("CUDA-aware MPI" in r["text"] for r in rows):
            yield self.from_rows(
                rows, f"{who} ran an MPI-backend collective on CUDA tensors, and the MPI library "
                "torch was built against is not CUDA-aware: use the NCCL backend for GPU "
                "tensors, move the tensors to the CPU first, or build against a CUDA-aware MPI.",
                shown=2, ranks=ranks, confidence=0.9, details={"device": "cuda"})
            return
        unknown = [r for r in rows if "which communication backend" in r["text"]]
        if unknown:
            device = unknown[0]["data"].get("device") or "this accelerator"
            yield self.from_rows(
                unknown, f"init_process_group found {device} and knows no communication backend "
                f"for it (no backend was given): pass one, `init_process_group(backend='gloo')` "
                f"with the tensors on the CPU (or the vendor's backend for {device}, when it has "
                "one).", shown=1, ranks=ranks, confidence=0.85, details={"device": device})
            return
        lacking = [r["data"] for r in rows if "does not support" in r["text"]
                   and r["data"].get("op") and r["data"].get("backend")]
        if lacking and len(lacking) == len(rows):
            backend, op = lacking[0]["backend"], lacking[0]["op"]
            yield self.from_rows(
                rows, f"{who} called {op} on a {backend} process group, which {backend} does "
                f"not implement: run that collective on a backend that has it (NCCL for CUDA "
                "tensors, with `init_process_group(backend='cpu:gloo,cuda:nccl')` for mixed "
                f"jobs), or replace it with collectives {backend} has (all_gather for "
                "all_to_all on CPU).", shown=2, ranks=ranks, confidence=0.85,
                details={"backend": backend, "op": op})
            return
        yield self.finding(
            f"{who} ran a collective on {what} that its backend does not "
            "support.", evidence=[evidence_of(r) for r in rows[:2]], ranks=ranks,
            confidence=0.9, ts=first_ts(rows), details={"device": device},
        )
