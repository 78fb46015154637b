"""One rank started a checkpoint save that every rank must call, and the others were elsewhere.

## What it detects
The last thing the logs show before the other ranks' collective timeout is the start of a save
that is itself a collective — accelerate's `save_state` of an FSDP, DeepSpeed or Megatron-LM
model ("Saving FSDP model", "Saving DeepSpeed Model and Optimizer"), a DeepSpeed checkpoint
("[Torch] Checkpoint global_step500 is about to be saved!") — with no line saying it finished,
while the other ranks time out in a collective of their own training step (an all-reduce of
more than one element, an all-gather, a broadcast), not in the save's closing barrier, and no
part of the same save finished just before (then every rank was in it: a slow write). These
frameworks log the save on the main process only, so the saving rank is the line's rank, or 0.

## Why it hangs or kills the job
Saving a sharded model gathers its state from every rank (FSDP's state-dict all-gathers,
DeepSpeed's tag check and barrier): every rank must call the save. Called under
`if accelerator.is_main_process:` (or `if rank == 0:`), rank 0 waits in the save's collectives
that no other rank calls, while the others go on to the next step and wait in its collectives:
the two sides never meet, and the watchdog aborts them at the process group timeout.

## Evidence
The save's start line and the other ranks' first timeout after it.

## Remedy
Call the save on every rank (`accelerator.save_state(...)`, `engine.save_checkpoint(...)`
outside any `is_main_process` / `rank == 0` guard): the framework writes the files once. Guard
only what is truly rank-local (printing, uploading the finished files).

## Example
```
INFO:accelerate.accelerator:Saving current state to output/checkpoint-2000
INFO:accelerate.accelerator:Saving DeepSpeed Model and Optimizer
[rank1]:[E ProcessGroupNCCL.cpp:523] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9012, OpType=ALLREDUCE, NumelIn=50331648, NumelOut=50331648, Timeout(ms)=600000) ran for 600388 milliseconds before timing out.
[rank2]:[E ProcessGroupNCCL.cpp:523] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9012, OpType=ALLREDUCE, NumelIn=50331648, NumelOut=50331648, Timeout(ms)=600000) ran for 600402 milliseconds before timing out.
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, ranks_of, subject

#: Watchdog lines name the collective the rank waited in (op, element count).
TIMEOUTS = ("watchdog_timeout", "watchdog_abort")
#: How close (in lines) the save's start must be to the first timeout after it, or to the end of
#: its log: the save's own lines come in between, a finished save is followed by training's.
WINDOW = 20


def _in_step(row: dict[str, Any]) -> bool:
    """Whether a timed-out collective is a training step's, not a barrier (a save's last wait):
    NCCL's barrier is a one-element all-reduce."""
    d = row["data"]
    op = str(d.get("op") or "").upper()
    numel = d.get("nin")
    if not op or "BARRIER" in op:
        return False
    if "ALLREDUCE" in op or op == "REDUCE":
        return isinstance(numel, int) and numel > 1
    return numel is None or numel > 1


class SaveOnOneRank(Rule):
    code = "COLL020"
    slug = "save-on-one-rank"
    cause = "collective_mismatch"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        saves = job.rows("distributed_save")
        timeouts = job.rows(*TIMEOUTS)
        if not saves or not timeouts or job.rows("oom"):
            return
        start = self._unfinished_start(job, saves, timeouts)
        if start is None:
            return
        saver = start["rank"] if start["rank"] is not None else 0
        if saver in job.crashes.ranks and saver not in ranks_of(timeouts):
            return  # the saving rank died: its crash is the story
        others = [t for t in timeouts if t["rank"] is not None and t["rank"] != saver]
        if not others or not all(_in_step(t) for t in others):
            return
        seqs = {t["data"].get("seq") for t in others}
        own = {t["data"].get("seq") for t in timeouts if t["rank"] == saver}
        if own & seqs - {None}:
            return  # the saving rank waited in the same collective as the others
        waiting = ranks_of(others)
        d = start["data"]
        what = d.get("start") or ""
        saving = f"the {what}" if what.startswith(("FSDP", "DeepSpeed", "Megatron")) \
            else f"DeepSpeed checkpoint {what}"
        op = others[0]["data"].get("op")
        seq = others[0]["data"].get("seq")
        at = f"{op} #{seq}" if seq is not None else str(op)
        yield self.finding(
            f"Rank {saver} started saving {saving}, a save every rank must call, and did not "
            f"finish it, while {subject(waiting).lower()} timed out in {at} of "
            f"{'their' if len(waiting) > 1 else 'its'} own training step: the save runs on rank {saver} only (called under "
            "`if accelerator.is_main_process:` or `if rank == 0:`), so its collectives and "
            "the others' never meet.",
            evidence=[evidence_of(start), evidence_of(others[0])], ranks=[saver],
            confidence=0.65, ts=first_ts(others),
            details={"save": start["text"][:200], "waiting": sorted(waiting)},
        )

    @staticmethod
    def _unfinished_start(job: Job, saves: list[dict[str, Any]],
                          timeouts: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The last save start that no end line follows and that is the last thing its log
        shows before a timeout (or before its end)."""
        for s in reversed([r for r in saves if "start" in r["data"]]):
            src, line = s["source"], s["line"]
            later = [t["line"] for t in timeouts if t["source"] == src and t["line"] > line]
            end = min(later) if later else job.lines_in(src) + 1
            done = any(r["source"] == src and line < r["line"] < end and "done" in r["data"]
                       for r in saves)
            # (a part of the same save that finished just before, "FSDP Model saved to ...":
            # its collectives ran on every rank, so every rank is in the save: a slow write)
            before = any(r["source"] == src and line - WINDOW <= r["line"] < line
                         and "done" in r["data"] for r in saves)
            if not done and not before and 0 < end - line <= WINDOW:
                return s
        return None
