"""The last thing the logs show before a collective timeout is one rank's own work.

## What it detects
Without stack dumps: a log whose last activity before the watchdog or Gloo timeout (or before
its end, when the timeouts come earlier or are in other ranks' logs) is work that a rank does
on its own and
names itself in — "Running predictions on sample x on rank=0", "[rank 0] Saving checkpoint",
"Evaluating on rank 0" — while other ranks time out waiting in a collective.

## Why it hangs or kills the job
Evaluation, prediction, plotting or checkpointing guarded by `if rank == 0:` runs while the
other ranks go on to the next collective and wait there. If it takes longer than the process
group timeout (10 or 30 minutes by default), the watchdog aborts the waiting ranks.

## Evidence
The rank's last work line and the first timeout after it.

## Remedy
Run the rank-local work on every rank (each on its shard), or make the others wait for it in a
barrier with a timeout long enough (`init_process_group(timeout=…)`, or a separate Gloo group
for the wait); save checkpoints with `torch.distributed.checkpoint` so every rank takes part.
`ddp-autopsy collect` on the hung job shows where that rank is.

## Example
```
Running predictions on sample clic_edm_ttbar_pf on rank=0:  75%|███████▌  | 3/4 [01:51<00:25, 25.36s/it]
[rank1]:[E1122 10:31:02.120000000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5012, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800042 milliseconds before timing out.
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, ranks_of, subject

TIMEOUTS = ("watchdog_timeout", "watchdog_abort", "watchdog_summary", "gloo_timeout")
#: How close (in lines) the work must be to the timeout, or to the end of its log.
WINDOW = 20


def _named_rank(row: dict[str, Any]) -> int | None:
    d = row["data"]
    return d.get("rank", row["rank"])


class RankLocalWorkBeforeTimeout(Rule):
    code = "COLL010"
    slug = "rank-local-work-before-timeout"
    cause = "rank_stuck_outside_collective"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        timeouts = job.rows(*TIMEOUTS)
        work = job.rows("rank_local_work")
        if not timeouts or not work:
            return
        timeout_lines: dict[str, list[int]] = {}
        for r in timeouts:
            timeout_lines.setdefault(r["source"], []).append(r["line"])
        last: dict[int, dict[str, Any]] = {}
        for r in work:
            rank = _named_rank(r)
            # The next timeout in the same file, or the file's end. A console that interleaves
            # ranks (torchrun --tee) may print a rank's last lines after the others' timeouts.
            later = [t for t in timeout_lines.get(r["source"], []) if t > r["line"]]
            end = min(later) if later else job.lines_in(r["source"]) + 1
            if rank is not None and 0 < end - r["line"] <= WINDOW:
                last[rank] = r
        busy = set(last)
        if not busy or (job.world_size and len(busy) >= job.world_size):
            return
        waiting = ranks_of(timeouts) - busy
        if ranks_of(timeouts) and not waiting:
            return  # only the busy ranks themselves timed out: not others waiting for them
        seqs = {r["rank"]: r["data"].get("seq") for r in timeouts
                if r["rank"] is not None and r["data"].get("seq") is not None}
        if busy <= set(seqs) and {seqs[r] for r in busy} <= {seqs[r] for r in waiting
                                                              if r in seqs}:
            return  # the busy ranks timed out in the same collective: they were in it (COLL004)
        rows = sorted(last.values(), key=lambda r: (r["source"], r["line"]))
        d = rows[-1]["data"]
        what = (d.get("what") or "its own work").lower()
        others = f"rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, sorted(waiting)))}" \
            if waiting else "the other ranks"
        yield self.finding(
            f"{subject(busy)} was busy with its own work ({what}) when {others} timed out "
            "waiting in a collective: the others went on to the next collective without it.",
            evidence=[evidence_of(rows[-1]), evidence_of(timeouts[0])], ranks=busy,
            confidence=0.6, ts=first_ts(timeouts),
            details={"work": {str(k): v["text"][:200] for k, v in last.items()}},
        )
