"""``collect``: snapshot a hung job on this host into a bundle directory, never hanging itself.

Phases (each action time-bounded, the whole run bounded by ``deadline_s``; the manifest is
rewritten after each phase with ``"complete": false`` until the end):

1. discover the job (``--pid`` → its tree, else the only job on the host);
2. per process, in parallel: ``/proc`` facts (cmdline, env, fds, maps → versions);
3. poke the Flight Recorder pipes (so that ranks dump while we work);
4. quick py-spy samples of every rank, a random gap apart (the manifest's earlier ``snapshots``:
   which ranks moved before the full dumps);
5. in parallel: py-spy dumps and ``info.json`` per process, host commands (``ip``,
   ``nvidia-smi``, ``dmesg``) then ``host.json``, rendezvous endpoint probes;
6. logs, Flight Recorder dumps, problems and warnings, the final manifest;
7. the optional ``.tar.gz``, bounded by the time left (its outcome rewrites the manifest).

Files the job names (logs, Flight Recorder dumps, init files) are read only as far as the job's own
user may read them (:mod:`~ddp_autopsy.collectors.access`). An interrupt (``opts.cancel``, set by
the CLI on SIGINT / SIGTERM) skips what is left, removes temp files and any partial tarball, and
leaves a manifest with ``"complete": false, "interrupted": true``.
"""

from __future__ import annotations

import os
import random
import socket
import tarfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddp_autopsy import __version__
from ddp_autopsy import bundle_layout as layout
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
from ddp_autopsy.collectors.access import Access, job_access
from ddp_autopsy.collectors.bundle import (
    DEADLINE_ERROR,
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
    require_member,
    select_job,
)
from ddp_autopsy.collectors.logs import MAX_LOG_BYTES
from ddp_autopsy.collectors.process_info import ProcessRecord, collect_facts, collect_stacks

MAX_WORKERS = 6
FR_WAIT_S = 5.0  # at most this long for triggered Flight Recorder dumps to appear
SAMPLE_GAP_S = (0.4, 0.9)  # between stack samples: random, so no job's loop beats in step with it
SAMPLE_TIMEOUT_S = 5.0  # one quick sample of one process
TAR_GRACE_S = 1.0  # the tar stops itself at the deadline; abandoned only if stuck this long after


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
    force: bool = False  # overwrite an existing <out>.tar.gz
    progress: bool = False
    max_log_bytes: int = MAX_LOG_BYTES  # per file; larger logs keep head and tail
    #: stack samples per rank: the last is the full dump, the earlier ones only tell which
    #: ranks moved (a rank seen once outside a collective may just be between two steps)
    samples: int = 3
    cancel: threading.Event | None = None  # set it (e.g. from a signal handler) to interrupt


@dataclass
class CollectResult:
    bundle: Path
    manifest: dict[str, Any]
    warnings: list[str]
    tarball: Path | None = None


def collect(opts: CollectOptions) -> CollectResult:
    """Collect a bundle for the job ``opts`` designates. Raises :class:`CollectError` when there is
    no such job (or several and none chosen); anything else ends in a bundle, partial or not."""
    deadline = Deadline(opts.deadline_s, opts.cancel)
    job = discover(opts, deadline)
    return collect_job(job, opts, deadline=deadline)


def discover(opts: CollectOptions, deadline: Deadline) -> JobCandidate:
    """Find the job, bounded: ``/proc`` reads can block on a process stuck in the kernel."""
    def find() -> JobCandidate:
        if opts.pid is not None:
            return require_member(job_for_pid(opts.pid), opts.pid)
        return select_job(find_jobs(), opts.job)

    timeout = deadline.budget(max(opts.step_timeout_s, 5.0))
    outcome = run_bounded(find, timeout, "discover", deadline.cancel_event)
    if deadline.cancelled:
        raise KeyboardInterrupt
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
    deadline = deadline or Deadline(opts.deadline_s, opts.cancel)
    t0 = deadline.started
    hostname = socket.gethostname()
    out = opts.out if opts.out is not None else default_out(hostname)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CollectError(f"output directory {out} exists and is not empty")
    if opts.tar and os.path.lexists(tarball_path(out)) and not opts.force:
        raise CollectError(f"{tarball_path(out)} exists: pass --force to overwrite it")
    access = job_access(job.pids)
    with _Progress(opts.progress) as advance:
        bundle = Bundle(out, deadline, on_action=advance)
        bundle.manifest = _initial_manifest(job, opts, hostname, access)
        bundle.write_manifest(complete=False, duration_s=time.monotonic() - t0)
        try:
            return _Collection(bundle, job, opts, t0, access).run()
        except BaseException as exc:  # a crash, or a second Ctrl-C: leave no partial file
            deadline.cancel()
            bundle.settle()
            _remove_partial_tar(bundle.root)
            if isinstance(exc, Exception):
                bundle.manifest["error"] = traceback.format_exc()
            else:
                bundle.manifest["interrupted"] = True
            bundle.write_manifest(complete=False, duration_s=time.monotonic() - t0)
            raise


class _Collection:
    """One collect run over an open bundle: the phases, in order."""

    def __init__(self, bundle: Bundle, job: JobCandidate, opts: CollectOptions,
                 t0: float, access: Access) -> None:
        self.bundle, self.job, self.opts, self.t0 = bundle, job, opts, t0
        self.access = access
        self.refused: list[str] = []  # besides logs: FR directories and dumps, init files
        self.step = opts.step_timeout_s
        self.procs: dict[int, ProcessRecord] = {}
        self.pyspy_exe = pyspy.find_pyspy()

    def run(self) -> CollectResult:
        with ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="ddp-autopsy") as pool:
            self.read_processes(pool)
            self.checkpoint()
            fr, triggered, fr_started = self.trigger_flight_recorder()
            self.early_snapshots(pool)
            self.sample(pool)
        self.checkpoint()
        plan = self.copy_logs()
        self.pick_up_flight_recorder(fr, triggered, fr_started)
        self.summarize()
        b = self.bundle
        problems = _problems(b, self.procs, plan, self.pyspy_exe, triggered, self.refused)
        warnings = _warnings(self.procs, problems, b.deadline.seconds)
        b.manifest.update(problems=problems, warnings=warnings)
        manifest = self.checkpoint(complete=not b.deadline.cancelled)
        tarball = None
        if self.opts.tar and not b.deadline.cancelled:
            tarball = tar_bundle(b, force=self.opts.force)
            if b.manifest["tar"]["status"] != OK and not b.deadline.cancelled:
                problem = _tar_problem(b.manifest["tar"])
                problems.append(problem)
                warnings.append(_warning(problem, b.deadline.seconds))
            manifest = self.checkpoint(complete=not b.deadline.cancelled)
        if b.deadline.cancelled:  # interrupted at any point: no partial file, no claim
            manifest, tarball = self.finish_interrupted(problems, warnings), None
        return CollectResult(bundle=b.root, manifest=manifest, warnings=warnings,
                             tarball=tarball)

    def finish_interrupted(self, problems: list[dict[str, Any]],
                           warnings: list[str]) -> dict[str, Any]:
        """Wait for the threads still at work, remove temp files and any partial tarball, and
        write the manifest as incomplete."""
        b = self.bundle
        b.settle()
        if self.opts.tar:
            _remove_partial_tar(b.root)
            b.manifest["tar"] = {"path": tarball_path(b.root).name, "status": SKIPPED,
                                 "files": 0, "total": None, "error": "collect was interrupted"}
        if not any(p["kind"] == "interrupted" for p in problems):
            problem = _interrupted_problem(b)
            problems.append(problem)
            warnings.append(_warning(problem, b.deadline.seconds))
        b.manifest.update(problems=problems, warnings=warnings, interrupted=True)
        return self.checkpoint(complete=False)

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
        return fr, flight_recorder.trigger(self.bundle, fr, step_timeout=self.step,
                                           access=self.access), started

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
            read = self.bundle.probe("read init file",
                                     lambda p=path: init_file.read_store(p, self.access),
                                     target=path, step_timeout=self.step)
            if read and read.done and read.error is None:
                found.append({**read.value, "local_users": len(workers)})
                if read.value.get("unreadable"):
                    self.refused.append(f"{path}: not readable by the job's user")
        if found:
            self.bundle.manifest["init_files"] = found

    def early_snapshots(self, pool: ThreadPoolExecutor) -> None:
        """Quick py-spy samples of every rank before the full dumps, a random gap apart: the
        manifest's ``snapshots`` (docs/bundle.md), from which the analysis tells the ranks that
        moved (a job between two steps) from those that stay where they are (a hang)."""
        b, rounds = self.bundle, self.opts.samples - 1
        pids = [p.member.pid for p in self.procs.values()
                if p.member.role == "worker" and p.info.get("status") == OK]
        timeout = min(self.step, SAMPLE_TIMEOUT_S)
        if rounds < 1 or not pids or self.pyspy_exe is None or \
                b.deadline.remaining() < rounds * SAMPLE_GAP_S[1] + 2 * timeout:
            return  # not worth the time the full dumps need
        exe, entries = self.pyspy_exe, []
        for i in range(rounds):
            if i:
                b.deadline.cancel_event.wait(random.uniform(*SAMPLE_GAP_S))
            if b.deadline.cancelled or not pids:
                break
            taken = datetime.now(timezone.utc).isoformat()
            rels = {pid: f"{layout.SNAPSHOTS}/collect-{i}/{pid}/stack.json" for pid in pids}
            runs = {pid: pool.submit(b.command, "py-spy sample",
                                     pyspy.dump_argv(exe, pid, as_json=True, native=False),
                                     target=f"pid {pid}", path=rels[pid], step_timeout=timeout,
                                     keep=pyspy.keep_call_args)
                    for pid in pids}
            stacks = {}
            for pid, fut in runs.items():
                got = fut.result()
                if got is not None and got.exit_code == 0 and not got.timeout_hit and \
                        pyspy.parses_as_json(b.root / rels[pid]):
                    stacks[str(pid)] = rels[pid]
            pids = [pid for pid in pids if str(pid) in stacks]  # a failed one is not retried
            entries.append({"index": i, "taken": taken, "by": "collect", "stacks": stacks})
        if entries:
            b.manifest["snapshots"] = entries

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
        b.write_json(layout.NETWORK_PROBES, [r for r in (f.result() for f in probes) if r])
        b.manifest["network"] = layout.NETWORK_PROBES
        workers = sorted((p for p in self.procs.values() if p.member.role == "worker"
                          and p.info.get("status") == OK),
                         key=lambda p: (p.member.rank is None, p.member.rank, p.member.pid))
        host.write_host_json(b, {name: fut.result() for name, fut in host_cmds.items()},
                             limits_pid=workers[0].member.pid if workers else None, step=step)

    def copy_logs(self) -> logs.LogPlan:
        # directory walks and globs run as probes too: a dead NFS mount must not hang us
        planned = self.bundle.probe(
            "find logs", lambda: _log_plan(self.opts.logs, self.procs, self.access),
            target="logs", step_timeout=self.step)
        plan = planned.value if planned and planned.done and planned.value else \
            logs.LogPlan(self.access)
        self.bundle.manifest["logs"] = logs.copy_all(self.bundle, plan, step_timeout=self.step,
                                                     limit=self.opts.max_log_bytes)
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
                fr.prefixes, fr_started, n_triggered, wait, self.access), target="fr",
                step_timeout=wait + 1)
        refused: list[str] = []
        found = b.probe("find flight recorder dumps",
                        lambda: flight_recorder.find_dumps(fr.prefixes, self.job.started,
                                                           self.access, refused),
                        target="fr", step_timeout=self.step)
        # a refusal is news for the directories the job names, not for the default places
        named = tuple(f"{os.path.dirname(p)}: " for p in fr.named)
        self.refused += [r for r in refused if r.startswith(named)]
        fresh, stale = found.value if found and found.done and found.value else ([], [])
        b.manifest["fr_dumps"] = flight_recorder.copy_dumps(b, fresh, step_timeout=self.step,
                                                            access=self.access,
                                                            refused=self.refused)
        b.manifest["fr"] = {"pipes": triggered, "prefixes": fr.prefixes, "skipped_stale": stale}


# -- manifest ---------------------------------------------------------------------------------
def _initial_manifest(job: JobCandidate, opts: CollectOptions, hostname: str,
                      access: Access) -> dict[str, Any]:
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
        "read_as": {"checked": access.checked,
                    "uids": sorted({c.uid for c in access.creds or ()})},
        "job": {"key": job.key, "launcher_pid": job.launcher_pid, "run_id": job.run_id,
                "world_size": job.world_size, "master_addr": job.master_addr,
                "master_port": job.master_port, "launcher": job.launcher,
                "cmdline": list(job.cmdline)},
        "processes": [_process_entry(m, None) for m in job.members],
        "logs": [],
        "fr_dumps": [],
        "problems": [],
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
        "info": layout.process_info(m.pid) if proc else None,
        "stack": stack.json_path if stack else None,
        "stack_text": stack.text_path if stack else None,
        "stack_status": stack.status if stack else "pending",
        "stack_error": stack.error if stack else None,
        "stack_source": stack.source if stack and stack.json_path else None,
        "proc_state": info.get("proc_state"),
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
def _log_plan(given: list[Path], procs_: dict[int, ProcessRecord],
              access: Access) -> logs.LogPlan:
    plan = logs.LogPlan(access)
    for path in given:  # absolute (not resolved): the access check walks from /
        plan.add_path(Path(os.path.abspath(path)), "given")
    for pid, proc in procs_.items():
        plan.add_fd(pid, 1, proc.info.get("stdout"), "stdout")
        plan.add_fd(pid, 2, proc.info.get("stderr"), "stderr")
        if proc.member.role == "agent":
            # read the raw command line: the redacted one may have masked a path, and the
            # displayed one replaced bytes that are not UTF-8 (surrogateescape keeps them)
            raw = procs.read_cmdline(pid, errors="surrogateescape") or ()
            for log_dir in logs.log_dirs_from_cmdline(raw, proc.info.get("cwd")):
                plan.add_path(log_dir, "log_dir", pid)
    return plan


def _problem(kind: str, *, pids: list[int] | None = None, targets: list[str] | None = None,
             count: int | None = None, detail: str | None = None) -> dict[str, Any]:
    """One manifest ``problems`` entry (docs/bundle.md); rule AUT003 reports them."""
    pids, targets = sorted(pids or []), list(targets or [])
    return {"kind": kind, "count": count if count is not None else len(pids) or len(targets),
            "pids": pids, "targets": targets, "detail": detail}


def _problems(bundle: Bundle, procs_: dict[int, ProcessRecord], plan: logs.LogPlan,
              pyspy_exe: str | None, triggered: list[dict[str, Any]],
              refused: list[str] | None = None) -> list[dict[str, Any]]:
    """What was not collected, besides stacks (each process's ``stack_status`` says that)."""
    out: list[dict[str, Any]] = []
    fallback = {pid: p.stack for pid, p in procs_.items() if p.stack is not None
                and p.stack.json_path and p.stack.source != "py-spy"}
    if pyspy_exe is None and not fallback:
        out.append(_problem("pyspy_missing", count=len(procs_)))
    if fallback:  # stacks taken without py-spy (pyspy.fallback): the analysis says how
        notes = sorted({s.note or s.source for s in fallback.values()})
        out.append(_problem("stack_fallback", pids=list(fallback), detail=notes[0]
                            + (f" (+{len(notes) - 1} other reasons)" if len(notes) > 1 else "")))
    env_errors: dict[str, list[int]] = {}
    info_failed: dict[str, list[int]] = {}
    for pid, proc in procs_.items():
        status = proc.info.get("status")
        if status in (TIMEOUT, ERROR, SKIPPED):
            info_failed.setdefault(status, []).append(pid)
        elif status == OK and proc.info.get("env_error") not in (None, EXITED):
            env_errors.setdefault(proc.info["env_error"], []).append(pid)
    out += [_problem("env_unreadable", pids=pids, detail=err) for err, pids in env_errors.items()]
    out += [_problem("info_failed", pids=pids, detail=st) for st, pids in info_failed.items()]
    skipped = [a for a in bundle.actions if a.status == SKIPPED and a.error == DEADLINE_ERROR]
    if skipped:
        out.append(_problem("deadline", count=len(skipped),
                            targets=sorted({_step(a) for a in skipped})))
    # py-spy timeouts are per-process stack statuses; /proc reads are info_failed above
    timed_out = [a for a in bundle.actions if a.timeout_hit
                 and not a.name.startswith("py-spy") and a.name != "process info"]
    if timed_out:
        out.append(_problem("step_timeout", count=len(timed_out),
                            targets=sorted({_step(a) for a in timed_out})))
    no_reader = [t["pipe"] for t in triggered if t["result"] == "no_reader"]
    if no_reader:
        out.append(_problem("fr_no_reader", targets=no_reader))
    if not plan.sources and not bundle.deadline.cancelled:
        out.append(_problem("no_logs", count=0))
    if plan.notes:
        out.append(_problem("log_not_collected", targets=list(plan.notes)))
    fr_refused = [t["pipe"] + ": " + t["result"].removeprefix("refused: ") for t in triggered
                  if t["result"].startswith("refused")]
    everything = list(dict.fromkeys([*plan.refused, *fr_refused, *(refused or [])]))
    if everything:
        out.append(_problem(REFUSED, targets=everything,
                            detail=_access_detail(plan.access)))
    if bundle.deadline.cancelled:
        out.append(_interrupted_problem(bundle))
    return out


REFUSED = "refused_unreadable_by_job_owner"


def _access_detail(access: Access) -> str:
    return "job owner " + ", ".join(str(c) for c in access.creds or ()) if access.creds \
        else "job owner unknown"


def _interrupted_problem(bundle: Bundle) -> dict[str, Any]:
    skipped = [a for a in bundle.actions if a.status == SKIPPED and a.error != DEADLINE_ERROR]
    return _problem("interrupted", count=len(skipped),
                    targets=sorted({_step(a) for a in skipped}),
                    detail="collect was interrupted (SIGINT or SIGTERM)")


def _step(action: Action) -> str:
    return f"{action.name} ({action.target})" if action.target else action.name


def _tar_problem(tar: dict[str, Any]) -> dict[str, Any]:
    return _problem("tar", targets=[tar["path"]], count=1,
                    detail=tar["status"] + (f": {tar['error']}" if tar.get("error") else ""))


def _warning(p: dict[str, Any], deadline_s: float) -> str:
    """A problem as the sentence ``warnings`` keeps (with the remedy)."""
    kind, pids, targets = p["kind"], p["pids"], p["targets"]
    if kind == "pyspy_missing":
        return "py-spy not found: no stack dumps (pip install py-spy)"
    if kind == "stack_fallback":
        return f"stacks of pid(s) {pids} not from py-spy: {p['detail']}"
    if kind == "env_unreadable":
        return (f"environment unreadable ({p['detail'].replace('_', ' ')}) for pid(s) {pids}: "
                "run collect as the job's user or root")
    if kind == "info_failed":
        return f"process facts ({p['detail']}) not read for pid(s) {pids}"
    if kind == "deadline":
        return f"deadline of {deadline_s:g}s reached: {p['count']} step(s) skipped"
    if kind == "step_timeout":
        return "timed out: " + ", ".join(targets)
    if kind == "fr_no_reader":
        return f"Flight Recorder pipe(s) without a reader, no dump triggered: {targets}"
    if kind == "no_logs":
        return ("no log files collected (stdout/stderr are not files, or unreadable): "
                "pass --logs PATH")
    if kind == "log_not_collected":
        return "; ".join(f"log not collected: {note}" for note in targets)
    if kind == "tar":
        return f"tarball not written ({p['detail']}); the bundle directory is complete"
    if kind == REFUSED:
        return (f"not copied, the job's user may not read them ({p['detail']}): "
                + "; ".join(targets))
    if kind == "interrupted":
        return f"collect was interrupted: {p['count']} step(s) not run; collect again"
    return f"{kind}: {targets or pids}"


def _warnings(procs_: dict[int, ProcessRecord], problems: list[dict[str, Any]],
              deadline_s: float) -> list[str]:
    out: list[str] = []
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
    for p in problems:
        if p["kind"] == "log_not_collected":  # one sentence per file
            out.extend(f"log not collected: {note}" for note in p["targets"])
        else:
            out.append(_warning(p, deadline_s))
    return out


# -- tar --------------------------------------------------------------------------------------
class _OutOfTime(Exception):
    pass


@dataclass
class TarResult:
    files: int  # added to the archive
    total: int  # in the bundle directory
    stopped: bool  # ran out of time: the partial archive was removed


class _BoundedReader:
    """A file object for ``tarfile`` that raises :class:`_OutOfTime` past ``stop_at`` or once
    ``cancel`` is set, so a large file cannot carry the tar past the deadline."""

    def __init__(self, fh: Any, stop_at: float, cancel: threading.Event | _Either) -> None:
        self._fh, self._stop_at, self._cancel = fh, stop_at, cancel

    def read(self, size: int = -1) -> bytes:  # tarfile reads in small blocks
        if self._cancel.is_set() or time.monotonic() > self._stop_at:
            raise _OutOfTime
        return self._fh.read(size)


def tarball_path(root: Path) -> Path:
    return root.with_name(root.name + ".tar.gz")


def _tar_tmp(tarball: Path) -> Path:
    return tarball.with_name(f".{tarball.name}.tmp")


def _remove_partial_tar(root: Path) -> None:
    _tar_tmp(tarball_path(root)).unlink(missing_ok=True)


def _is_temp(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith((".tmp", ".tail"))


class TarExists(FileExistsError):
    pass


def _publish(tmp: Path, tarball: Path, force: bool) -> None:
    """Move the finished archive into place; without ``force`` never over an existing file
    (a hard link fails if the name is taken, where a rename would replace it)."""
    if force:
        os.replace(tmp, tarball)
        return
    try:
        os.link(tmp, tarball)
    except FileExistsError:
        raise TarExists(f"{tarball.name} exists (pass --force to overwrite it)") from None
    except OSError:  # a filesystem without hard links
        if os.path.lexists(tarball):
            raise TarExists(f"{tarball.name} exists (pass --force to overwrite it)") from None
        os.replace(tmp, tarball)
        return
    tmp.unlink()


def _write_tar(root: Path, tarball: Path, stop_at: float, cancel: threading.Event | _Either,
               force: bool = False) -> TarResult:
    """``root`` as ``<root.name>/…`` into ``tarball`` (via a 0600 temp file beside it), stopping
    at ``stop_at`` or when ``cancel`` is set."""
    entries = sorted(p for p in root.rglob("*") if not _is_temp(p))
    total = sum(p.is_file() for p in entries)
    tmp = _tar_tmp(tarball)
    tmp.unlink(missing_ok=True)  # left by a collect killed with SIGKILL
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    added = 0
    try:
        with os.fdopen(fd, "wb") as fh, \
                tarfile.open(fileobj=fh, mode="w:gz", compresslevel=6) as tar:
            tar.add(root, arcname=root.name, recursive=False)
            for path in entries:
                info = tar.gettarinfo(path, arcname=f"{root.name}/{path.relative_to(root)}")
                if info.isreg():
                    with open(path, "rb") as src:
                        tar.addfile(info, _BoundedReader(src, stop_at, cancel))
                    added += 1
                else:
                    tar.addfile(info)
        if cancel.is_set():  # abandoned by the caller: never publish late
            raise _OutOfTime
        _publish(tmp, tarball, force)
        return TarResult(added, total, stopped=False)
    except _OutOfTime:
        tmp.unlink(missing_ok=True)
        return TarResult(added, total, stopped=True)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def tar_bundle(bundle: Bundle, force: bool = False) -> Path | None:
    """Write ``<out>.tar.gz`` (mode 0600) within the time left before the deadline; an existing
    archive is replaced only with ``force``.

    A tar that runs out of time or is interrupted stops and removes its partial archive (the
    directory stays complete); the outcome is the manifest's ``tar`` entry and a ``tar`` action.
    Returns the tarball, or None when none was written."""
    root = bundle.root
    tarball = tarball_path(root)
    cancel = bundle.deadline.cancel_event
    abandon = threading.Event()
    stop_at = time.monotonic() + bundle.deadline.remaining()
    outcome = bundle.probe("tar", lambda: _write_tar(root, tarball, stop_at, _Either(cancel,
                                                                                     abandon),
                                                     force),
                           target=tarball.name, step_timeout=bundle.deadline.remaining(),
                           grace_s=TAR_GRACE_S, kind="file")
    entry: dict[str, Any] = {"path": tarball.name, "status": SKIPPED, "files": 0, "total": None,
                             "error": "deadline reached before the tar started"}
    if outcome is not None and outcome.action is not None:
        action = outcome.action
        result = outcome.value if outcome.done else None
        if not outcome.done:
            abandon.set()  # if the writer ever wakes up, it removes its temp file
            action.error = (f"tar stuck past the deadline, abandoned after {action.timeout_s}s "
                            "(a temp file may remain)")
        elif result is not None and result.stopped:
            action.status, action.timeout_hit, action.truncated = TIMEOUT, True, True
            action.error = (f"stopped at the deadline after {result.files} of {result.total} "
                            "files; partial archive removed")
        elif result is not None:
            action.path = None  # outside the bundle: the manifest's paths are relative to it
        entry = {"path": tarball.name, "status": action.status,
                 "files": result.files if result else 0,
                 "total": result.total if result else None, "error": action.error}
    bundle.manifest["tar"] = entry
    return tarball if entry["status"] == OK else None


class _Either:
    """``is_set()`` of two events (the run's interrupt, this tar's abandonment)."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        self._a, self._b = a, b

    def is_set(self) -> bool:
        return self._a.is_set() or self._b.is_set()


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
