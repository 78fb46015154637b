"""Two ranks on the same GPU.

## What it detects
NCCL's "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1a000" (2.5–2.29) and
"Multiple ranks detected using the same GPU" / "Multiple Ranks are using the same GPU" (2.30+).
Without that line (older NCCL, or NCCL_DEBUG unset), NCCL's "invalid usage" at start-up in a
one-node job whose processes see fewer GPUs than it has ranks (Lightning's "LOCAL_RANK: 0 -
CUDA_VISIBLE_DEVICES: [0]" with "MEMBER: 2/2") is reported at a lower confidence; a bare "NCCL
error: invalid usage" before any collective ran, with nothing else said, lower still: two ranks on
one GPU is by far that error's most common cause at start-up; so is NCCL's return trail of it
alone ("NCCL INFO init.cc:840 -> 5") from two processes of one host whose NCCL_DEBUG prefix names
the same device ("[0]"). CUDA's own "CUDA-capable device(s)
is/are busy or unavailable" (error 46) says the same on a GPU in exclusive-process mode.

## Why it hangs or kills the job
NCCL refuses to build a communicator with two ranks on one device (ncclInvalidUsage): process
group creation fails on those ranks and the job dies at its first collective.

## Evidence
The NCCL warning or the `Last error:` line of PyTorch's NCCL error, with the ranks and bus id.

## Remedy
Give each local rank its own device: `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`
before `init_process_group`, don't hard-code `cuda:0`, and check that CUDA_VISIBLE_DEVICES is
not the same single GPU for every process.

## Example
```
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ddp_autopsy.analyzer.attribution import declared_nodes
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.lines import nccl_device
from ddp_autopsy.rules.base import Finding, Rule, subject

INVALID_USAGE = re.compile(r"NCCL error[^\n]*?invalid usage|ncclInvalidUsage")




class DuplicateGpu(Rule):
    code = "NCCL002"
    slug = "duplicate-gpu"
    cause = "duplicate_gpu"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("duplicate_gpu")
        if not rows:
            found = list(self._device_busy(job))
            yield from found or self._too_few_devices(job)
            return
        ranks: set[int] = set()
        buses: set[str] = set()
        for r in rows:
            d = r["data"]
            ranks |= {d[k] for k in ("r1", "r2") if k in d}
            buses |= {d[k] for k in ("busid",) if k in d}
        where = f" (CUDA device bus id {', '.join(sorted(buses))})" if buses else ""
        who = subject(ranks, "Several ranks")
        yield self.from_rows(rows, f"{who} use the same GPU{where}.", shown=2, ranks=ranks,
                             confidence=0.95, details={"bus_ids": sorted(buses)})

    def _device_busy(self, job: Job) -> Iterator[Finding]:
        """CUDA's cudaErrorDevicesUnavailable ("CUDA-capable device(s) is/are busy or
        unavailable", error 46): a GPU in exclusive-process compute mode that another process
        already holds, another rank of the job (two ranks on one GPU, or a rank touching GPU 0
        before set_device) or another job."""
        rows = [r for r in job.rows("cuda_failure", "exception")
                if "busy or unavailable" in r["text"]]
        if not rows:
            return
        ranks = {r["rank"] for r in rows if r["rank"] is not None}
        yield self.from_rows(
            rows, f"{subject(ranks, 'A rank')} found its GPU busy (CUDA error 46, "
            "'CUDA-capable device(s) is/are busy or unavailable'): the GPU is in exclusive-process "
            "mode and another process holds it, most often another rank on the same device (no "
            "torch.cuda.set_device(LOCAL_RANK) before the first CUDA call, or a context made on "
            "GPU 0 by every rank) or another job.", shown=2, ranks=ranks, confidence=0.55)

    def _too_few_devices(self, job: Job) -> Iterator[Finding]:
        """NCCL's 'invalid usage' at start-up in a one-node job with more ranks than the
        devices its processes see (Lightning's "CUDA_VISIBLE_DEVICES: [0]" for 2 ranks, from
        `--gpus "0,0"`): two ranks on one GPU, which NCCL before 2.8 reports only that way."""
        invalid = [r for r in job.rows("nccl_error")
                   if "invalid usage" in str(r["data"].get("estr", ""))]
        seen = job.rows("visible_devices")
        worlds = [r["data"]["world"] for r in job.rows("run_start") if "world" in r["data"]]
        if not (seen and worlds):
            yield from self._bare_invalid_usage(job)
            return
        if not invalid or not seen or not worlds or declared_nodes(job.events) > 1:
            return
        devices = {d.strip() for r in seen for d in r["data"]["devices"].split(",") if d.strip()}
        world = max(worlds)
        if len({r["host"] for r in seen}) > 1 or len(devices) >= world:
            return
        yield self.from_rows(
            [*seen[:1], *invalid[:1]], f"{world} ranks run on one node that shows them "
            f"{len(devices)} GPU{'s' if len(devices) != 1 else ''} "
            f"(CUDA_VISIBLE_DEVICES: [{', '.join(sorted(devices))}]), and NCCL refused the "
            "communicator with 'invalid usage': several ranks use the same GPU.",
            ranks=(), confidence=0.6, details={"devices": sorted(devices), "world_size": world})

    def _bare_invalid_usage(self, job: Job) -> Iterator[Finding]:
        """NCCL's 'invalid usage' with nothing else said (NCCL prints its reason only at
        NCCL_DEBUG=WARN): two ranks on one GPU is by far its most common cause at start-up,
        so it is named, at a low confidence, when the job had not started its collectives."""
        if job.rows("watchdog_timeout", "coll_progress", "nccl_message_truncated",
                    "collective_fingerprint_mismatch"):
            return
        invalid = [r for r in job.rows("nccl_error", "exception")
                   if INVALID_USAGE.search(r["text"])]
        if not invalid:
            # or only NCCL's return trail of it ("NCCL INFO init.cc:840 -> 5", 5 being
            # ncclInvalidUsage) from two processes of one host on the same device ([0])
            trail = [r for r in job.rows("nccl_error_trace") if r["data"].get("code") == 5]
            same_dev: dict[tuple, set] = {}
            for r in trail:
                dev = nccl_device(r["text"])
                if dev is not None and r["host"] and r["pid"] is not None:
                    same_dev.setdefault((r["host"], dev), set()).add(r["pid"])
            invalid = [r for r in trail if any(len(p) > 1 for p in same_dev.values())]
            if not invalid:
                return
        yield self.from_rows(
            invalid, "NCCL refused the communicator with 'invalid usage' and gave no reason "
            "(NCCL_DEBUG=WARN prints it): most often two ranks were given the same GPU.",
            shown=2, ranks=(), confidence=0.4, details={"inferred": True})
