"""collect could not gather everything it looks for.

## What it detects
The `problems` a collect bundle's manifest records, other than missing stacks (AUT002):
environments it could not read, processes whose `/proc` facts timed out or failed, steps skipped
at the global deadline or cut at their step timeout, Flight Recorder pipes nobody reads, logs not
collected (none found, or some unreadable), py-spy missing, and a `--tar` archive that ran out of
time, files refused because the job's own user may not read them, and an interrupted collect.

## Why it hangs or kills the job
It doesn't: it is about this analysis. What was not collected is missing from the verdict: an
unreadable environment hides the settings the ENV rules compare, missing logs hide every error
message, a missing Flight Recorder dump hides the collective each rank waits in.

## Evidence
The bundle manifest's `problems` entries: kind, processes, steps or paths.

## Remedy
Depends on the kind (each finding carries its own):
- `env_unreadable`: run collect as the job's user or as root.
- `info_failed`: a process stuck in the kernel (state D) blocks `/proc` reads; raise
  `--step-timeout` and look at `/proc/PID/status` and `/proc/PID/stack`.
- `deadline`: raise `--deadline` (or lower `--step-timeout`, so one slow step cannot use it up).
- `step_timeout`: raise `--step-timeout`; check for a dead network mount (logs) or slow DNS
  (the rendezvous probe).
- `fr_no_reader`: the rank's NCCL heartbeat monitor serves the pipe, only with
  `TORCH_NCCL_TRACE_BUFFER_SIZE` > 0 and monitoring on (`TORCH_NCCL_ENABLE_MONITORING`, the
  default); a Gloo rank or a pipe left from an earlier run has no reader. Set
  `TORCH_NCCL_DUMP_ON_TIMEOUT=1` so that ranks dump when their watchdog fires.
- `no_logs`: pass `--logs PATH`; or start the job with output in files (torchrun `--log-dir`
  with `--redirects 3` or `--tee 3`, or shell redirection).
- `log_not_collected`: fix the file's permissions or pass it with `--logs`.
- `pyspy_missing`: `pip install py-spy` where collect runs.
- `stack_fallback`: py-spy failed and the stacks were taken another way (the job's
  faulthandler, or `python -m profiling.sampling` on 3.15+): no idle flags or native frames;
  fix what the detail says py-spy hit (permissions, its Python version support).
- `tar`: the bundle directory is complete: archive it yourself (`tar czf`) or raise `--deadline`.
- `refused_unreadable_by_job_owner`: collect ran with more privilege than the job and did not
  copy what the job's own user may not read (a path the job named, or `--logs`); if the file
  should be shared, copy it yourself.
- `interrupted`: collect was stopped (SIGINT/SIGTERM) before its end: collect again.

Then collect again while the job still hangs.

## Example
```json
{"schema": "ddp-autopsy/bundle/1", "host": "node1", "complete": true,
 "processes": [{"pid": 101, "role": "worker", "rank": 0, "stack_status": "ok"}],
 "actions": [], "logs": [],
 "problems": [
  {"kind": "env_unreadable", "count": 1, "pids": [101], "targets": [], "detail": "permission_denied"},
  {"kind": "no_logs", "count": 0, "pids": [], "targets": [], "detail": null}]}
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding, Rule, Severity

# kind → (what went wrong, for the summary; remedy; severity)
KINDS: dict[str, tuple[str, str, Severity]] = {
    "env_unreadable": (
        "could not read the environment of {n} process(es) ({detail}); the ENV rules did not "
        "see their settings",
        "Run collect as the job's user or as root.", "warning"),
    "info_failed": (
        "could not read /proc facts of {n} process(es) ({detail})",
        "A process stuck in the kernel (state D) blocks /proc reads: raise --step-timeout and "
        "look at /proc/PID/status and /proc/PID/stack.", "warning"),
    "deadline": (
        "reached its global deadline: {n} step(s) skipped",
        "Raise --deadline (or lower --step-timeout, so one slow step cannot use it up).",
        "warning"),
    "step_timeout": (
        "stopped {n} step(s) at the step timeout",
        "Raise --step-timeout; check for a dead network mount (logs) or slow DNS (the "
        "rendezvous probe).", "warning"),
    "fr_no_reader": (
        "found {n} Flight Recorder pipe(s) nobody reads: no dump was triggered there",
        "The rank's NCCL heartbeat monitor serves the pipe, only with "
        "TORCH_NCCL_TRACE_BUFFER_SIZE > 0 and monitoring on (TORCH_NCCL_ENABLE_MONITORING, the "
        "default); a Gloo rank or a pipe left from an earlier run has no reader. Set "
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1 so that ranks dump when their watchdog fires.", "info"),
    "no_logs": (
        "collected no logs: the processes write to no file it could find",
        "Pass --logs PATH, or start the job with its output in files (torchrun --log-dir with "
        "--redirects 3 or --tee 3, or shell redirection).", "warning"),
    "log_not_collected": (
        "could not collect {n} log(s)",
        "Fix the files' permissions or pass them with --logs.", "warning"),
    "pyspy_missing": (
        "found no py-spy: no stack dumps at all",
        "pip install py-spy where collect runs.", "warning"),
    "stack_fallback": (
        "took the stacks of {n} process(es) without py-spy: {detail}",
        "The stacks are real but thinner than py-spy's (no idle flags, no native frames, "
        "function names without their class). Fix what py-spy hit (ptrace permission, a "
        "Python version it does not read yet) to get its dumps again.", "info"),
    "tar": (
        "wrote no tarball ({detail})",
        "The bundle directory is complete: archive it yourself (tar czf) or raise --deadline.",
        "info"),
    "refused_unreadable_by_job_owner": (
        "did not copy {n} path(s) the job's own user may not read ({detail})",
        "collect ran with more privilege than the job and copies only what the job's user may "
        "read (docs/bundle.md). If such a file should be in the bundle, copy it yourself.",
        "info"),
    "interrupted": (
        "was interrupted before its end ({n} step(s) not run)",
        "Collect again while the job still hangs (without interrupting it).", "warning"),
}


class CollectionIncomplete(Rule):
    code = "AUT003"
    slug = "collection-incomplete"
    role = "info"
    severity = "warning"
    requires = ()

    @classmethod
    def example_files(cls) -> dict[str, bytes]:
        return {"bundle/manifest.json": cls.example().encode()}

    def check(self, job: Job) -> Iterator[Finding]:
        # kind → [(bundle, host, problem)], in the order the bundles record them
        found: dict[str, list[tuple[Any, str | None, dict[str, Any]]]] = {}
        for b in job.bundles:
            for p in b.manifest.get("problems") or []:
                if isinstance(p, dict) and isinstance(p.get("kind"), str):
                    found.setdefault(p["kind"], []).append((b, b.manifest.get("host"), p))
        for kind, items in found.items():
            yield self._finding(kind, items)

    def _finding(self, kind: str, items: list[tuple[Any, str | None, dict[str, Any]]]
                 ) -> Finding:
        what, remedy, severity = KINDS.get(
            kind, ("recorded a problem of kind " + kind, self.remedy(), "warning"))
        hosts = sorted({h for _, h, _ in items if h})
        n = sum(_int(p.get("count")) for _, _, p in items)
        details = sorted({str(p["detail"]).replace("_", " ") for _, _, p in items
                          if p.get("detail")})
        where = f"collect on {', '.join(hosts)}" if hosts else "collect"
        summary = f"{where} " + what.format(n=n, detail="; ".join(details) or "unknown") + "."
        ranks = [r for b, _, p in items for r in _ranks(b.manifest, p.get("pids") or [])]
        evidence = [Evidence(path=f"{b.display}/manifest.json", line=None, host=h,
                             text=_text(p)) for b, h, p in items]
        return self.finding(
            summary, evidence=evidence, ranks=ranks, hosts=hosts, confidence=1.0,
            severity=severity, remedy=remedy,
            details={"kind": kind, "count": n,
                     "pids": sorted({x for _, _, p in items for x in p.get("pids") or []}),
                     "targets": [t for _, _, p in items for t in p.get("targets") or []][:50]},
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _ranks(manifest: dict[str, Any], pids: list[Any]) -> list[int]:
    """The ranks of these pids' processes, where the manifest names them."""
    rank = {p.get("pid"): p.get("rank") for p in manifest.get("processes") or []
            if isinstance(p, dict)}
    return [r for r in (rank.get(pid) for pid in pids) if isinstance(r, int)]


def _text(p: dict[str, Any]) -> str:
    """``env_unreadable (permission_denied): pids 101, 102``."""
    head = p["kind"] + (f" ({p['detail']})" if p.get("detail") else "")
    what = [f"pids {', '.join(map(str, p['pids'][:10]))}"] if p.get("pids") else []
    targets = [str(t) for t in p.get("targets") or []]
    if targets:
        what.append("; ".join(targets[:3]) + (f" (+{len(targets) - 3} more)"
                                              if len(targets) > 3 else ""))
    return head + (": " + " — ".join(what) if what else "")
