"""``collect``: snapshot a hung job on this host into a bundle directory, never hanging itself.

Phases (each action time-bounded, the whole run bounded by ``deadline_s``; the manifest is
rewritten after each phase with ``"complete": false`` until the end):

1. discover the job (``--pid`` → its tree, else the only job on the host);
2. per process, in parallel: ``/proc`` facts (cmdline, env, fds, maps → versions);
3. poke the Flight Recorder pipes (so that ranks dump while we work);
4. in parallel: py-spy dumps and ``info.json`` per process, host commands (``ip``,
   ``nvidia-smi``, ``dmesg``) then ``host.json``, rendezvous endpoint probes;
5. logs, Flight Recorder dumps, warnings, the final manifest, the optional ``.tar.gz``.
"""

from __future__ import annotations

import os
import socket
import tarfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from ddp_autopsy import __version__
from ddp_autopsy.collectors import (
    flight_recorder,
    host,
    init_file,
    logs,
    network,
    procs,
    pyspy,
    summaries,
)
from ddp_autopsy.collectors.bundle import (
    ERROR,
    EXITED,
    OK,
    PERMISSION_DENIED,
    SCHEMA,
    SKIPPED,
    TIMEOUT,
    Action,
    Bundle,
    Deadline,
    now_iso,
    run_bounded,
)
from ddp_autopsy.collectors.jobs import (
    CollectError,
    JobCandidate,
    Member,
    find_jobs,
    job_for_pid,
    select_job,
)
from ddp_autopsy.collectors.process_info import ProcessRecord, collect_facts, collect_stacks

MAX_WORKERS = 6
FR_WAIT_S = 5.0  # at most this long for triggered Flight Recorder dumps to appear


@dataclass
class CollectOptions:
    pid: int | None = None
    job: str | None = None
    out: Path | None = None
    logs: list[Path] = field(default_factory=list)
    deadline_s: float = 60.0
    step_timeout_s: float = 10.0
    native: bool = False
    tar: bool = False
    progress: bool = False


@dataclass
class CollectResult:
    bundle: Path
    manifest: dict[str, Any]
    warnings: list[str]
    tarball: Path | None = None


def collect(opts: CollectOptions) -> CollectResult:
    """Collect a bundle for the job ``opts`` designates. Raises :class:`CollectError` when there is
    no such job (or several and none chosen); anything else ends in a bundle, partial or not."""
    deadline = Deadline(opts.deadline_s)
    job = discover(opts, deadline)
    return collect_job(job, opts, deadline=deadline)


def discover(opts: CollectOptions, deadline: Deadline) -> JobCandidate:
    """Find the job, bounded: ``/proc`` reads can block on a process stuck in the kernel."""
    def find() -> JobCandidate:
        if opts.pid is not None:
            return job_for_pid(opts.pid)
        return select_job(find_jobs(), opts.job)

    timeout = deadline.budget(max(opts.step_timeout_s, 5.0))
    outcome = run_bounded(find, timeout, "discover")
    if not outcome.done:
        raise CollectError(f"process discovery did not finish within {timeout:.1f}s")
    if outcome.error is not None:
        raise outcome.error
    assert outcome.value is not None
    return outcome.value


def default_out(hostname: str, parent: Path | None = None) -> Path:
    base = (parent or Path.cwd()) / f"ddp-autopsy-{hostname}-{datetime.now():%Y%m%d-%H%M%S}"
    out, n = base, 1
    while out.exists():
        out = base.with_name(f"{base.name}-{n}")
        n += 1
    return out


def collect_job(job: JobCandidate, opts: CollectOptions, *,
                deadline: Deadline | None = None) -> CollectResult:
    """Collect a bundle for an already discovered ``job``."""
    deadline = deadline or Deadline(opts.deadline_s)
    t0 = deadline.started
    hostname = socket.gethostname()
    out = opts.out if opts.out is not None else default_out(hostname)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CollectError(f"output directory {out} exists and is not empty")
    with _Progress(opts.progress) as advance:
        bundle = Bundle(out, deadline, on_action=advance)
        bundle.manifest = _initial_manifest(job, opts, hostname)
        bundle.write_manifest(complete=False, duration_s=time.monotonic() - t0)
        try:
            return _Collection(bundle, job, opts, t0).run()
        except Exception:
            bundle.manifest["error"] = traceback.format_exc()
            bundle.write_manifest(complete=False, duration_s=time.monotonic() - t0)
            raise


class _Collection:
    """One collect run over an open bundle: the phases, in order."""

    def __init__(self, bundle: Bundle, job: JobCandidate, opts: CollectOptions,
                 t0: float) -> None:
        self.bundle, self.job, self.opts, self.t0 = bundle, job, opts, t0
        self.step = opts.step_timeout_s
        self.procs: dict[int, ProcessRecord] = {}
        self.pyspy_exe = pyspy.find_pyspy()

    def run(self) -> CollectResult:
        with ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="ddp-autopsy") as pool:
            self.read_processes(pool)
            self.checkpoint()
            fr, triggered, fr_started = self.trigger_flight_recorder()
            self.sample(pool)
        self.checkpoint()
        plan = self.copy_logs()
        self.pick_up_flight_recorder(fr, triggered, fr_started)
        self.summarize()
        warnings = _warnings(self.bundle, self.procs, plan, self.pyspy_exe, triggered)
        self.bundle.manifest["warnings"] = warnings
        manifest = self.checkpoint(complete=True)
        tarball = _tar(self.bundle.root) if self.opts.tar else None
        return CollectResult(bundle=self.bundle.root, manifest=manifest, warnings=warnings,
                             tarball=tarball)

    def checkpoint(self, complete: bool = False) -> dict[str, Any]:
        self.bundle.manifest["processes"] = [_process_entry(p.member, p)
                                             for p in self.procs.values()] \
            or self.bundle.manifest["processes"]
        return self.bundle.write_manifest(complete=complete,
                                          duration_s=time.monotonic() - self.t0)

    def read_processes(self, pool: ThreadPoolExecutor) -> None:
        """``/proc`` facts of every member, in parallel."""
        members = self.job.members or tuple(Member(pid=pid, ppid=0, role="other")
                                            for pid in self.job.pids)
        for proc in pool.map(lambda m: collect_facts(self.bundle, m, self.step), members):
            self.procs[proc.member.pid] = proc

    def trigger_flight_recorder(self) -> tuple[flight_recorder.FrPlan, list[dict[str, Any]],
                                               float]:
        """Poke the FR pipes first, so the ranks dump while we take the stacks."""
        workers = [p for p in self.procs.values() if p.member.role == "worker" and p.env]
        fr = flight_recorder.plan((p.member.rank, p.env or {}, p.info.get("cwd"))
                                for p in workers)
        started = time.time()
        return fr, flight_recorder.trigger(self.bundle, fr, step_timeout=self.step), started

    def read_spawn_indexes(self, pool: ThreadPoolExecutor) -> None:
        """mp.spawn children: discovery numbered them in pid order; the index mp.spawn really
        gave each one is the ``i`` of its ``_wrap`` frame (after the stack dumps: one py-spy
        at a time per process)."""
        kids = [p for p in self.procs.values() if p.member.spawn_index is not None
                and p.stack is not None and p.stack.status == OK]
        if not kids or self.pyspy_exe is None:
            return
        exe, b = self.pyspy_exe, self.bundle
        futs = {p.member.pid: pool.submit(
            b.probe, "mp.spawn index (py-spy --locals)",
            lambda pid=p.member.pid: pyspy.read_spawn_index(exe, pid, self.step),
            target=f"pid {p.member.pid}", step_timeout=self.step, grace_s=1.0) for p in kids}
        found = {pid: o.value for pid, f in futs.items()
                 if (o := f.result()) is not None and o.done and o.error is None
                 and o.value is not None}
        if len(found) == len(kids) and len(set(found.values())) == len(found):
            for p in kids:
                p.member = replace(p.member, spawn_index=found[p.member.pid],
                                   spawn_index_source="py-spy locals")

    def read_init_files(self) -> None:
        """The ``file://`` rendezvous files named in the workers' arguments or environment."""
        workers = [p for p in self.procs.values() if p.member.role == "worker"]
        paths = init_file.urls_in([*(a for p in workers for a in p.info.get("cmdline") or []),
                                   *(v for p in workers for v in (p.env or {}).values())])
        found = []
        for path in paths[:4]:
            read = self.bundle.probe("read init file", lambda p=path: init_file.read_store(p),
                                     target=path, step_timeout=self.step)
            if read and read.done and read.error is None:
                found.append({**read.value, "local_users": len(workers)})
        if found:
            self.bundle.manifest["init_files"] = found

    def sample(self, pool: ThreadPoolExecutor) -> None:
        """Stacks, host commands and endpoint probes, all at once."""
        b, step = self.bundle, self.step
        stacks = {pid: pool.submit(collect_stacks, b, self.pyspy_exe, p,
                                   native=self.opts.native, step=step)
                  for pid, p in self.procs.items()}
        host_cmds = {name: pool.submit(host.run_command, b, name, step) for name in host.COMMANDS}
        probes = [pool.submit(_probe_endpoint, b, ep, self.job, step)
                  for ep in _endpoints(self.job, self.procs)]
        for pid, fut in stacks.items():
            self.procs[pid].stack = fut.result()
        self.read_spawn_indexes(pool)
        self.read_init_files()
        b.write_json("network/probe.json", [r for r in (f.result() for f in probes) if r])
        b.manifest["network"] = "network/probe.json"
        workers = sorted((p for p in self.procs.values() if p.member.role == "worker"
                          and p.info.get("status") == OK),
                         key=lambda p: (p.member.rank is None, p.member.rank, p.member.pid))
        host.write_host_json(b, {name: fut.result() for name, fut in host_cmds.items()},
                             limits_pid=workers[0].member.pid if workers else None, step=step)

    def copy_logs(self) -> logs.LogPlan:
        # directory walks and globs run as probes too: a dead NFS mount must not hang us
        planned = self.bundle.probe("find logs", lambda: _log_plan(self.opts.logs, self.procs),
                                    target="logs", step_timeout=self.step)
        plan = planned.value if planned and planned.done and planned.value else logs.LogPlan()
        self.bundle.manifest["logs"] = logs.copy_all(self.bundle, plan, step_timeout=self.step)
        return plan

    def summarize(self) -> None:
        """Pre-parse the copied logs (summaries.py); a failure only costs the shortcut."""
        self.checkpoint()
        done = self.bundle.probe("summarize logs", lambda: summaries.write(self.bundle.root),
                                 target="summaries", step_timeout=max(self.step, 30.0))
        if done and done.done and done.value:
            self.bundle.manifest["summaries"] = done.value

    def pick_up_flight_recorder(self, fr: flight_recorder.FrPlan,
                                triggered: list[dict[str, Any]], fr_started: float) -> None:
        b = self.bundle
        n_triggered = sum(t["result"] == "triggered" for t in triggered)
        if n_triggered:
            wait = min(FR_WAIT_S, b.deadline.remaining())
            b.probe("wait for flight recorder dumps", lambda: flight_recorder.wait_for_dumps(
                fr.prefixes, fr_started, n_triggered, wait), target="fr", step_timeout=wait + 1)
        found = b.probe("find flight recorder dumps",
                        lambda: flight_recorder.find_dumps(fr.prefixes, self.job.started),
                        target="fr", step_timeout=self.step)
        fresh, stale = found.value if found and found.done and found.value else ([], [])
        b.manifest["fr_dumps"] = flight_recorder.copy_dumps(b, fresh, step_timeout=self.step)
        b.manifest["fr"] = {"pipes": triggered, "prefixes": fr.prefixes, "skipped_stale": stale}


# -- manifest ---------------------------------------------------------------------------------
def _initial_manifest(job: JobCandidate, opts: CollectOptions, hostname: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "tool": {"name": "ddp-autopsy", "version": __version__},
        "host": hostname,
        "created": now_iso(),
        "duration_s": 0.0,
        "deadline_s": opts.deadline_s,
        "step_timeout_s": opts.step_timeout_s,
        "native": opts.native,
        "complete": False,
        "job": {"key": job.key, "launcher_pid": job.launcher_pid, "run_id": job.run_id,
                "world_size": job.world_size, "master_addr": job.master_addr,
                "master_port": job.master_port, "launcher": job.launcher,
                "cmdline": list(job.cmdline)},
        "processes": [_process_entry(m, None) for m in job.members],
        "logs": [],
        "fr_dumps": [],
        "warnings": [],
    }


def _process_entry(m: Member, proc: ProcessRecord | None) -> dict[str, Any]:
    stack = proc.stack if proc else None
    info = proc.info if proc else {}
    return {
        "pid": m.pid, "ppid": m.ppid, "role": m.role, "rank": m.rank,
        "local_rank": m.local_rank, "world_size": m.world_size, "spawn_index": m.spawn_index,
        "spawn_index_source": m.spawn_index_source,
        "worker_pid": m.worker_pid, "cmdline": info.get("cmdline"),
        "info": f"processes/{m.pid}/info.json" if proc else None,
        "stack": stack.json_path if stack else None,
        "stack_text": stack.text_path if stack else None,
        "stack_status": stack.status if stack else "pending",
        "stack_error": stack.error if stack else None,
    }


# -- network ----------------------------------------------------------------------------------
def _endpoints(job: JobCandidate,
               procs_: dict[int, ProcessRecord]) -> list[tuple[str, int | None, str]]:
    """Workers' MASTER_ADDR:PORT, the launcher's, and torchrun's --rdzv-endpoint."""
    extra: list[tuple[str, int | None, str]] = []
    if job.master_addr:
        extra.append((job.master_addr, job.master_port, "launcher"))
    agent = procs_.get(job.launcher_pid)
    extra += network.rdzv_endpoints(agent.info.get("cmdline") or [] if agent else [])
    envs = [p.env for p in procs_.values() if p.env and p.member.role in ("worker", "agent")]
    return network.endpoints(envs, extra)


def _probe_endpoint(bundle: Bundle, ep: tuple[str, int | None, str], job: JobCandidate,
                    step: float) -> dict[str, Any] | None:
    addr, port, source = ep
    outcome = bundle.probe(
        "rendezvous probe",
        lambda: network.probe_endpoint(addr, port, job.pids, timeout=step, source=source),
        target=f"{addr}:{port}", step_timeout=step + network.CONNECT_TIMEOUT_S)
    if outcome is None or not outcome.done or outcome.error is not None:
        status = "skipped" if outcome is None else "timeout" if not outcome.done else "error"
        return {"master_addr": addr, "master_port": port, "source": source, "status": status}
    return {**(outcome.value or {}), "status": OK}


# -- logs, warnings, tar ----------------------------------------------------------------------
def _log_plan(given: list[Path], procs_: dict[int, ProcessRecord]) -> logs.LogPlan:
    plan = logs.LogPlan()
    for path in given:
        plan.add_path(Path(path), "given")
    for pid, proc in procs_.items():
        plan.add_fd(pid, 1, proc.info.get("stdout"), "stdout")
        plan.add_fd(pid, 2, proc.info.get("stderr"), "stderr")
        if proc.member.role == "agent":
            # read the raw command line: the redacted one may have masked a path
            raw = procs.read_cmdline(pid) or ()
            for log_dir in logs.log_dirs_from_cmdline(raw, proc.info.get("cwd")):
                plan.add_path(log_dir, "log_dir", pid)
    return plan


def _warnings(bundle: Bundle, procs_: dict[int, ProcessRecord], plan: logs.LogPlan,
              pyspy_exe: str | None, triggered: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    if pyspy_exe is None:
        out.append("py-spy not found: no stack dumps (pip install py-spy)")
    by_status: dict[str, list[int]] = {}
    for pid, proc in procs_.items():
        if proc.stack is not None and proc.stack.status != OK:
            by_status.setdefault(proc.stack.status, []).append(pid)
    if PERMISSION_DENIED in by_status:
        out.append(f"stack dump not permitted for pid(s) {by_status[PERMISSION_DENIED]}: "
                   + pyspy.PTRACE_REMEDY)
    for status, label in ((TIMEOUT, "timed out"), (EXITED, "process exited"),
                          (pyspy.NOT_PYTHON, "not a Python process"), (ERROR, "failed"),
                          (SKIPPED, "skipped at the deadline")):
        if status in by_status:
            out.append(f"stack dump {label} for pid(s) {by_status[status]}")
    denied_env = [pid for pid, p in procs_.items() if p.info.get("env_error") == PERMISSION_DENIED]
    if denied_env:
        out.append(f"environment unreadable (permission denied) for pid(s) {denied_env}: run "
                   "collect as the job's user or root")
    skipped = sum(a.status == SKIPPED for a in bundle.actions)
    if skipped:
        out.append(f"deadline of {bundle.deadline.seconds:g}s reached: {skipped} step(s) skipped")
    timed_out = [a for a in bundle.actions if a.timeout_hit and not a.name.startswith("py-spy")]
    if timed_out:
        out.append("timed out: " + ", ".join(sorted({f"{a.name} ({a.target})"
                                                     for a in timed_out})))
    no_reader = [t["pipe"] for t in triggered if t["result"] == "no_reader"]
    if no_reader:
        out.append(f"Flight Recorder pipe(s) without a reader, no dump triggered: {no_reader}")
    if not plan.sources:
        out.append("no log files collected (stdout/stderr are not files, or unreadable): "
                   "pass --logs PATH")
    out.extend(f"log not collected: {note}" for note in plan.notes)
    return out


def _tar(root: Path) -> Path:
    tarball = root.with_name(root.name + ".tar.gz")
    tmp = tarball.with_name(f".{tarball.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    os.replace(tmp, tarball)
    return tarball


class _Progress:
    """Rich progress on stderr (only when asked: the CLI asks when stderr is a TTY)."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Callable[[Action], None] | None:
        if not self._enabled:
            return None
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn(), TextColumn("collecting: {task.description}"),
                                  TextColumn("[dim]{task.completed} steps"),
                                  TimeElapsedColumn(), console=Console(stderr=True),
                                  transient=True)
        self._progress.start()
        self._task = self._progress.add_task("starting", total=None)
        return self._advance

    def _advance(self, action: Action) -> None:
        self._progress.update(self._task, advance=1,
                              description=f"{action.name} {action.target or ''}")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
