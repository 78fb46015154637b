"""The launcher terminated the remaining workers (a symptom).

## What it detects
torchelastic's "Sending process PID closing signal SIGTERM" / "Closing process PID via signal",
"Received 15 death signal, shutting down workers", and workers that failed with SIGTERM or
SIGABRT (the watchdog's abort) after another failure.

## Why it hangs or kills the job
When one worker fails, the agent stops the others; a SIGABRT is the NCCL watchdog taking a
process down after a timeout. Both follow a failure elsewhere.

## Evidence
The agent's signal lines and the workers' exit codes.

## Remedy
Look at the first failure among the other findings; these workers were stopped because of it.

## Example
```
W1026 03:51:31.222000 2521679 site-packages/torch/distributed/elastic/multiprocessing/api.py:908] Sending process 2521733 closing signal SIGTERM
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule


class WorkersTerminated(Rule):
    code = "SYM003"
    slug = "workers-terminated"
    role = "symptom"
    severity = "info"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("closing_signal", "agent_signal")
        rows += [r for r in job.rows("worker_failed")
                 if r["data"].get("exitcode") in (-15, -6, -2)]
        if not rows:
            return
        pids = sorted({r["data"].get("pid") for r in rows} - {None})
        summary = "The launcher stopped the remaining workers"
        summary += f" (pids {', '.join(map(str, pids[:8]))})." if pids else "."
        yield self.from_rows(rows, summary, confidence=0.9)
