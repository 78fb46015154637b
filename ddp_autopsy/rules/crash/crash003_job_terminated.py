"""The job was stopped from outside: a signal to the launcher, or the scheduler.

## What it detects
The launcher or the job received a signal that no rank sent: torchelastic's agent "Received 1
death signal, shutting down workers" (or `Signals.SIGHUP`) and the `closing signal SIGHUP` /
`SIGINT` it forwards to its workers, `SignalException: Process N got signal: 15`, Lightning's
"Received SIGTERM: 15", submitit's "this job is preempted", and slurmstepd's `*** JOB … CANCELLED
AT … DUE TO TIME LIMIT ***` (or PREEMPTION, JOB REQUEUE, NODE FAILURE, or a plain scancel).
With none of these, torchelastic's `RendezvousClosedError` with no worker failure (another node's
agent left the job and closed the rendezvous behind it: most often stopped or scaled down, though
an agent whose workers failed with no restarts left closes it too), and Python's `KeyboardInterrupt`
(Ctrl-C), are reported at low confidence: Ctrl-C is often pressed on a job that already hung,
whose cause any other rule comes first with.

## Why it hangs or kills the job
Nothing in the training failed: the terminal or SSH session that started the job closed (SIGHUP),
someone pressed Ctrl-C (SIGINT), or the scheduler ended the job (SIGTERM at a time limit, a
preemption, `scancel`). The launcher then stops every worker, and each prints the errors of a
job torn down mid-step.

## Evidence
The launcher's or the scheduler's line naming the signal or the cancellation.

## Remedy
SIGHUP: run the job in `tmux`/`screen`, detach it with `setsid` (or `disown` it), or submit it to
the scheduler instead of an interactive shell; `nohup` alone does not help, since torchrun's agent
installs its own SIGHUP handler over the ignored signal. Time limit: ask for more time (`--time`), or checkpoint and requeue
(`--signal=USR1@120` with a handler that saves). Preemption: checkpoint often and requeue. A plain
SIGTERM: see who stopped it (`sacct -j JOBID`, the scheduler's or the orchestrator's events).

## Example
```
W0920 09:10:41.194000 84933 site-packages/torch/distributed/elastic/agent/server/api.py:719] Received 1 death signal, shutting down workers
W0920 09:10:41.195000 84933 site-packages/torch/distributed/elastic/multiprocessing/api.py:900] Sending process 85005 closing signal SIGHUP
```
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule

#: Signals a launcher forwards to its workers only when it received them itself (after a
#: worker's failure it sends SIGTERM, so SIGTERM alone says nothing).
FORWARDED = ("SIGHUP", "SIGINT")
# ("Process 81061 got signal: 1"; torch 1.9-1.10 wrote "got sigval:1")
SIGNAL_EXCEPTION = re.compile(r"got (?:signal: |sigval: ?)(?P<signum>\d+)")

WHY = {
    "SIGHUP": "the launcher received SIGHUP: the terminal or SSH session that started it closed",
    "SIGINT": "the launcher received SIGINT (Ctrl-C)",
    "SIGTERM": "it received SIGTERM: the scheduler (a time limit, a preemption), or a user's "
               "kill or scancel",
    "SIGKILL": "it was killed with SIGKILL from outside",
    "SIGUSR1": "the scheduler signalled it (SIGUSR1: time limit near, or preemption)",
    "SIGUSR2": "the scheduler signalled it (SIGUSR2: preemption)",
}


def _signame(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("SIG"):
        return value
    try:
        return signal.Signals(int(value)).name
    except (TypeError, ValueError):
        return None


#: LSF's and PBS's termination reasons, in slurmstepd's words ("DUE TO TIME LIMIT").
SCHEDULER_REASONS = {
    "RUNLIMIT": "TIME LIMIT", "CPULIMIT": "CPU TIME LIMIT", "walltime": "TIME LIMIT",
    "wallclock": "TIME LIMIT",
    "cput": "CPU TIME LIMIT", "WINDOW": "RUN WINDOW CLOSING", "PREEMPT": "PREEMPTION",
    "OWNER": "ITS OWNER (bkill)", "FORCE_OWNER": "ITS OWNER (bkill)",
    "REQUEUE_OWNER": "ITS OWNER (brequeue)", "ADMIN": "AN ADMINISTRATOR",
    "FORCE_ADMIN": "AN ADMINISTRATOR", "REQUEUE_ADMIN": "AN ADMINISTRATOR (brequeue)",
    "EXTERNAL_SIGNAL": "A SIGNAL FROM OUTSIDE LSF", "BUCKET_KILL": "A BULK KILL (bkill -b)",
}


def _what(row: dict[str, Any]) -> str | None:
    """What stopped the job, as a signal name or a scheduler reason."""
    d = row["data"]
    if row["kind"] == "external_signal" and d.get("what"):
        reason = d.get("reason")
        reason = SCHEDULER_REASONS.get(reason, reason) if isinstance(reason, str) else reason
        return f"CANCELLED {reason}" if reason else "CANCELLED"
    if row["kind"] == "exception":
        m = SIGNAL_EXCEPTION.search(d.get("msg") or "")
        return _signame(m["signum"]) if m else None
    return _signame(d.get("signame") or d.get("signal") or d.get("signum"))


def _after_task_failure(job: Job, cancel: dict[str, Any]) -> bool:
    """Whether a task failure (an out-of-memory kill, srun's "task N: Exited with exit code",
    a signal a process died of) came before ``cancel`` in its own file."""
    return any(r["source"] == cancel["source"] and (r["line"] or 0) < (cancel["line"] or 0)
               for r in job.rows("oom", "srun_task_failed", "native_signal"))


class JobTerminated(Rule):
    code = "CRASH003"
    slug = "job-terminated"
    cause = "job_terminated"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("agent_signal", "external_signal")
        rows += [r for r in job.rows("closing_signal") if r["data"].get("signal") in FORWARDED]
        rows += [r for r in job.rows("exception")
                 if str(r["data"].get("type", "")).endswith("SignalException")]
        stops = [(r, w) for r in rows if (w := _what(r)) is not None]
        if not stops:
            yield from self._rendezvous_closed(job)
            yield from self._interrupted(job)
            return
        whats = [w for _, w in stops]
        cancelled = next((w for w in whats if w.startswith("CANCELLED")), None)
        preempted = next((r for r, _ in stops if "this job is preempted" in r["text"]), None)
        if preempted and not (cancelled or "").removeprefix("CANCELLED").strip():
            # (submitit's own words: its preemption signal, SIGUSR2 or SIGHUP, is not a hang-up;
            # slurmstepd's bare cancel after it is the preemption's)
            why = (f"the scheduler preempted it (submitit caught "
                   f"{_what(preempted) or 'its signal'})")
        elif cancelled:
            reason = cancelled.removeprefix("CANCELLED").strip().lower()
            why = f"the scheduler cancelled it ({reason})" if reason else \
                "the scheduler cancelled it (scancel, or the job's limits)"
        else:
            # A forwarded SIGHUP/SIGINT names what the launcher got better than its SIGTERMs.
            name = next((w for w in whats if w in FORWARDED), whats[0])
            why = WHY.get(name, f"it received {name}")
        evidence_rows = [r for r, w in stops if w == cancelled] or [r for r, _ in stops]
        if set(whats) == {"CANCELLED"} and _after_task_failure(job, evidence_rows[0]):
            # A bare step cancel after a task of that step failed: srun tearing the step down
            # (--kill-on-bad-exit, or the step ending with the task), not an outside stop.
            yield self.from_rows(
                evidence_rows, "SLURM cancelled the job step after one of its tasks had failed: "
                "srun's teardown of the step, a consequence of that failure.", shown=1,
                ranks=(), confidence=0.4, role="symptom", details={"signals": ["CANCELLED"]})
            return
        yield self.from_rows(
            evidence_rows, f"The job was stopped from outside, not by a failing rank: {why}.",
            shown=2, ranks=(), confidence=0.75,
            details={"signals": sorted(set(whats))})

    def _rendezvous_closed(self, job: Job) -> Iterator[Finding]:
        """torchelastic's RendezvousClosedError and no failure of a worker: another node's agent
        closed the rendezvous as it left the job (an agent shuts its rendezvous down on any
        exit: stopped, scaled down or removed, or its workers failed with no restarts left, which
        this node's workers would most often have felt), so this agent could not re-form the
        group. A low confidence: the other node's log says which."""
        rows = [r for r in job.rows("exception")
                if str(r["data"].get("type", "")).endswith("RendezvousClosedError")]
        if not rows or job.crashes.ranks or job.rows("worker_failed", "oom", "spawn_failed"):
            return
        yield self.from_rows(
            rows, "Another node's torchelastic agent closed the rendezvous as it left the job, "
            "so this agent could not form the group again (RendezvousClosedError); nothing in "
            "these inputs failed. An agent closes it on any exit: most often it was stopped or "
            "its node scaled down or removed, but also when its own workers failed with no "
            "restarts left.", shown=1, ranks=(), confidence=0.4,
            remedy="Read the other nodes' agent logs for why theirs exited (a signal, a "
            "scale-down, or a worker failure with --max-restarts used up); an elastic job that "
            "should survive a node leaving needs --nnodes MIN:MAX with MIN below the nodes left.",
            details={"signals": []})

    def _interrupted(self, job: Job) -> Iterator[Finding]:
        """Python's KeyboardInterrupt and nothing else: SIGINT reached the job (Ctrl-C in its
        terminal). Often pressed on a job that already hung, to see where it was: a suspicion
        that any rule reading a failure comes before."""
        rows = [r for r in job.rows("exception")
                if str(r["data"].get("type", "")).rsplit(".", 1)[-1] == "KeyboardInterrupt"]
        if not rows:
            return
        yield self.from_rows(
            rows, "The job was interrupted with Ctrl-C (SIGINT: Python's KeyboardInterrupt), "
            "not by a failing rank; if it was pressed on a job that had stopped making progress, "
            "the stacks in the KeyboardInterrupt tracebacks show where each process waited.",
            shown=2, ranks=(), confidence=0.3, details={"signals": ["SIGINT"]})
