"""collect could not take the stack of some processes.

## What it detects
Processes in a collect bundle without a stack dump, and why: ptrace not permitted (containers
without SYS_PTRACE, `kernel.yama.ptrace_scope`), py-spy timed out, the process exited during
collection, or it was skipped at the deadline. Ranks (workers) come first; the torchrun agent,
DataLoader workers and other processes of the job are named with their role. A non-Python
process that is not a rank (a shell or srun launcher) is not a failed dump.

## Why it hangs or kills the job
It doesn't by itself, but the ranks without a stack are exactly the ones the stack rules cannot
place; a hung rank that py-spy could not read is a strong suspect. A missing agent or DataLoader
stack matters less: it hides a stuck rendezvous or a data loader the rank waits on.

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
  {"pid": 100, "role": "agent", "rank": null, "stack": null, "stack_status": "permission_denied"},
  {"pid": 101, "role": "worker", "rank": 0, "stack": null, "stack_status": "permission_denied"},
  {"pid": 102, "role": "worker", "rank": 1, "stack": null, "stack_status": "permission_denied"}],
 "actions": [], "logs": []}
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding, Rule, format_ranks

WHY = {
    "permission_denied": "ptrace not permitted",
    "timeout": "py-spy timed out",
    "exited": "the process exited during collection",
    "skipped": "skipped at the collect deadline",
    "pending": "collect stopped before the dump",
    "error": "py-spy failed",
    "not_python": "not a Python process",
}
ROLE_NAMES = {"agent": "torchrun agent", "dataloader": "DataLoader worker",
              "other": "other process"}
ROLE_ORDER = {"worker": 0, "agent": 1, "dataloader": 2}  # the rank's own stack matters most


def _why(status: str) -> str:
    return WHY.get(status, status)


class StackDumpFailed(Rule):
    code = "AUT002"
    slug = "stack-dump-failed"
    role = "info"
    severity = "warning"
    requires = ("processes",)

    @classmethod
    def example_files(cls) -> dict[str, bytes]:
        return {"bundle/manifest.json": cls.example().encode()}

    def check(self, job: Job) -> Iterator[Finding]:
        status, role = pl.col("stack_status"), pl.col("role")
        failed = job.processes.filter(
            status.is_not_null() & (status != "ok")
            # a non-Python launcher (shell, srun step) has no Python stack to miss
            & ((role == "worker") | (status != "not_python"))
        ).sort([role.replace_strict(ROLE_ORDER, default=len(ROLE_ORDER)), "rank", "pid"],
               nulls_last=True)
        if not failed.height:
            return
        workers = failed.filter(role == "worker")
        others = failed.filter(role != "worker")
        parts = [f"No stack dump for {workers.height} rank(s) ({_ranks_why(workers)})"] \
            if workers.height else []
        if others.height:
            lead = "also none for" if parts else "No stack dump for"
            parts.append(f"{lead} {_others_why(others)}")
        summary = "; ".join(parts) + "."
        if not workers.height:
            summary += " Every rank's own stack was taken."
        yield self.finding(
            summary,
            evidence=[Evidence(path=f"{r['bundle']}/manifest.json", line=None, rank=r["rank"],
                               host=r["host"],
                               text=f"pid {r['pid']} ({r['role']}): {r['stack_status']}")
                      for r in failed.head(5).iter_rows(named=True)],
            ranks=[r for r in workers["rank"].to_list() if r is not None],
            hosts=[h for h in failed["host"].to_list() if h], confidence=1.0,
            severity="warning" if workers.height else "info",
            details={"roles": dict(failed.group_by("role").len().iter_rows()),
                     "pids": failed["pid"].to_list()},
        )


def _ranks_why(workers: pl.DataFrame) -> str:
    parts = []
    for (st,), grp in workers.group_by("stack_status", maintain_order=True):
        ranks = [r for r in grp["rank"].to_list() if r is not None]
        who = f"rank{'s' if len(set(ranks)) > 1 else ''} {format_ranks(ranks)}" if ranks \
            else f"{grp.height} of unknown rank"
        parts.append(f"{who}: {_why(str(st))}")
    return "; ".join(parts)


def _others_why(others: pl.DataFrame) -> str:
    """``the torchrun agent (pid 100: py-spy timed out), 2 DataLoader workers of rank 2 …``."""
    parts = []
    for (rl, st), grp in others.group_by(["role", "stack_status"], maintain_order=True):
        rows: list[dict[str, Any]] = list(grp.iter_rows(named=True))
        name = ROLE_NAMES.get(str(rl), f"{rl} process")
        ranks = sorted({r["rank"] for r in rows if r["rank"] is not None})
        of = f" of rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}" \
            if rl == "dataloader" and ranks else ""
        pids = ", ".join(str(r["pid"]) for r in rows[:3]) + (", …" if len(rows) > 3 else "")
        who = f"the {name}" if len(rows) == 1 else f"{len(rows)} {name}s"
        parts.append(f"{who}{of} (pid {pids}: {_why(str(st))})")
    return ", ".join(parts)
