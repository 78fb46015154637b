"""collect could not take the stack of some ranks.

## What it detects
Worker processes in a collect bundle without a stack dump, and why: ptrace not permitted
(containers without SYS_PTRACE, `kernel.yama.ptrace_scope`), py-spy timed out, the process
exited during collection, or it was skipped at the deadline.

## Why it hangs or kills the job
It doesn't by itself, but the ranks without a stack are exactly the ones the stack rules cannot
place; a hung rank that py-spy could not read is a strong suspect.

## Evidence
The bundle's per-process stack status.

## Remedy
For permission errors run collect with the same user as the job and CAP_SYS_PTRACE
(`docker run --cap-add SYS_PTRACE`, a Kubernetes securityContext capability, or
`sysctl kernel.yama.ptrace_scope=0`); for timeouts raise `--step-timeout`; then collect again.

## Example
```json
{"schema": "ddp-autopsy/bundle/1", "host": "node1", "complete": true,
 "processes": [
  {"pid": 101, "role": "worker", "rank": 0, "stack": null, "stack_status": "permission_denied"},
  {"pid": 102, "role": "worker", "rank": 1, "stack": null, "stack_status": "permission_denied"}],
 "actions": [], "logs": []}
```
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding, Rule, format_ranks

WHY = {
    "permission_denied": "ptrace not permitted",
    "timeout": "py-spy timed out",
    "exited": "the process exited during collection",
    "skipped": "skipped at the collect deadline",
    "error": "py-spy failed",
    "not_python": "not a Python process",
}


class StackDumpFailed(Rule):
    code = "AUT002"
    slug = "stack-dump-failed"
    role = "info"
    severity = "warning"
    inputs = ("processes",)

    @classmethod
    def example_files(cls) -> dict[str, bytes]:
        return {"bundle/manifest.json": cls.example().encode()}

    def check(self, job: Job) -> Iterator[Finding]:
        failed = job.processes.filter(
            (pl.col("role") == "worker") & pl.col("stack_status").is_not_null()
            & (pl.col("stack_status") != "ok")
        )
        if not failed.height:
            return
        parts = []
        for status, grp in failed.group_by("stack_status", maintain_order=True):
            ranks = [r for r in grp["rank"].to_list() if r is not None]
            who = f"ranks {format_ranks(ranks)}" if ranks else f"{grp.height} process(es)"
            parts.append(f"{who}: {WHY.get(str(status[0]), status[0])}")
        yield self.finding(
            f"No stack dump for {failed.height} worker(s) ({'; '.join(parts)}).",
            evidence=[Evidence(path=f"{r['bundle']}/manifest.json", line=None, rank=r["rank"],
                               host=r["host"], text=f"pid {r['pid']}: {r['stack_status']}")
                      for r in failed.head(3).iter_rows(named=True)],
            ranks=[r for r in failed["rank"].to_list() if r is not None],
            hosts=[h for h in failed["host"].to_list() if h], confidence=1.0,
        )
