"""The watch loop: follow one job, declare a hang or a crash, collect, analyze, report.

Every ``tick`` seconds: ``/proc`` CPU and I/O of every rank, the size of the job's log files (new
watchdog / timeout lines are printed as they appear), the shared directory's triggers; py-spy
samples only when :class:`~ddp_autopsy.watch.detector.Detector` asks for them. On a hang: the
bundle is taken with :func:`ddp_autopsy.collectors.collect.collect_job` (which also pokes the
Flight Recorder pipes), the detector's last samples are added to it as earlier snapshots,
it is analyzed with the analyzer and the rules, and the verdict is printed. On the end of the job
(a rank or the launcher exited): the logs seen while watching are collected and analyzed too,
unless the job ended with exit code 0.

Everything the watcher decides is appended to ``<out>/events.jsonl`` (one JSON object a line).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.collectors import procs, pyspy
from ddp_autopsy.collectors.bundle import Deadline
from ddp_autopsy.collectors.collect import CollectOptions, collect_job, discover
from ddp_autopsy.collectors.jobs import CollectError, JobCandidate, job_for_pid
from ddp_autopsy.redact import redact_obj
from ddp_autopsy.watch import probe
from ddp_autopsy.watch.detector import Detector, Status
from ddp_autopsy.watch.shared import Meeting

KEEP_ROUNDS = 3  # py-spy rounds kept in memory for the bundle's snapshots
KILL_GRACE_S = 20.0
SAMPLE_THREADS = 4
START_SETTLE_S = 3.0  # run: the worker count unchanged this long means all ranks started


@dataclass
class WatchOptions:
    pid: int | None = None
    job: str | None = None
    hang_after: float = 300.0
    tick: float = 1.0
    out: Path | None = None
    logs: list[Path] = field(default_factory=list)
    shared_dir: Path | None = None
    node: str | None = None
    on_hang: str | None = None
    upload: str | None = None  # post-mortem service URL (ddp-autopsy serve)
    upload_token: str | None = None
    kill_after: float | None = None
    once: bool = False  # stop watching after the first hang's report
    deadline_s: float = 60.0
    step_timeout_s: float = 10.0
    color: bool | None = None
    start_timeout_s: float = 120.0  # run: how long the job may take to start its ranks


@dataclass
class Worker:
    pid: int
    key: str
    env: dict[str, str] | None = None  # its initial environment (for the stack fallbacks)


class Watcher:
    def __init__(self, opts: WatchOptions, *, child: subprocess.Popen[bytes] | None = None,
                 echo: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        self.opts = opts
        self.child = child
        self.echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stop = stop or threading.Event()
        self.host = socket.gethostname()
        self.node = opts.node or self.host
        self.out = opts.out or Path.cwd() / \
            f"ddp-autopsy-watch-{self.host}-{datetime.now():%Y%m%d-%H%M%S}"
        self.out.mkdir(parents=True, exist_ok=True)
        self.events = self.out / "events.jsonl"
        self.pyspy_exe = pyspy.find_pyspy()
        self.job: JobCandidate | None = None
        self.workers: dict[int, Worker] = {}
        self.exit_codes: dict[str, int | None] = {}
        self.tail = probe.LogTail()
        self.rounds: deque[tuple[float, dict[int, bytes]]] = deque(maxlen=KEEP_ROUNDS)
        self.detector: Detector | None = None
        self.meeting: Meeting | None = None
        self.hangs = 0
        self.fallback_noted = False  # the first fallback sample is announced, once
        self.found_problem = False
        self.kill_at: float | None = None
        self.killed = False
        self.pool = ThreadPoolExecutor(SAMPLE_THREADS, thread_name_prefix="ddp-autopsy-watch")

    # -- events -----------------------------------------------------------------------------
    def event(self, kind: str, message: str | None = None, **data: Any) -> None:
        record = {"t": time.time(), "event": kind, **data}
        if message:
            record["message"] = message
        with open(self.events, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
        if message:
            self.echo(f"ddp-autopsy watch: {message}")

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self._attach()
            assert self.job is not None and self.detector is not None
            while not self.stop.is_set():
                ended = self._tick()
                if ended is not None:
                    return ended
                if self.opts.once and self.hangs and self.kill_at is None and not self.killed:
                    return self._after_once()
                self.stop.wait(self.opts.tick)
            self.event("stopped", "interrupted; stopped watching")
            return 130
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _attach(self) -> None:
        """Find the job (``--pid`` / ``--job`` / the only one; for ``run``, the child's tree,
        waiting for its ranks to start)."""
        if self.child is not None:
            end = time.monotonic() + self.opts.start_timeout_s
            seen: tuple[int, float] = (0, 0.0)  # workers found, since when
            while True:
                if self.child.poll() is not None:
                    raise _Ended(self.child.returncode)
                with contextlib.suppress(CollectError):
                    job = job_for_pid(self.child.pid)
                    workers = [m.pid for m in job.members if m.role == "worker"]
                    if len(workers) != seen[0]:
                        seen = (len(workers), time.monotonic())
                    # the launcher starts its ranks one by one (slowly on a loaded host): all
                    # of them, as LOCAL_WORLD_SIZE says, or as many as stayed so for a while
                    expected = _local_world(workers)
                    if workers and ((expected and len(workers) >= expected)
                                    or time.monotonic() - seen[1] >= START_SETTLE_S):
                        break
                if time.monotonic() > end:
                    if seen[0]:
                        break
                    raise CollectError(f"the job started no ranks within "
                                       f"{self.opts.start_timeout_s:g}s")
                if self.stop.wait(0.5):
                    raise KeyboardInterrupt
        else:
            copts = CollectOptions(pid=self.opts.pid, job=self.opts.job,
                                   step_timeout_s=self.opts.step_timeout_s)
            job = discover(copts, Deadline(self.opts.deadline_s))
        self._adopt(job)
        now = time.monotonic()
        self.detector = Detector(self.opts.hang_after, now)
        for w in self.workers.values():
            self.detector.track(w.pid, w.key)
        if self.opts.shared_dir is not None:
            self.meeting = Meeting(self.opts.shared_dir, self.node, job.key)
            self.meeting.heartbeat(force=True)
        self.event("start", f"watching {job.describe()}; hang after {self.opts.hang_after:g}s"
                   + ("" if self.pyspy_exe else "; py-spy not found: stack samples only from "
                      "the fallbacks (docs/watch.md)"),
                   job=job.key, launcher_pid=job.launcher_pid,
                   ranks={w.key: w.pid for w in self.workers.values()},
                   logs=list(self.tail.sizes), hang_after=self.opts.hang_after,
                   pyspy=self.pyspy_exe, out=str(self.out))

    def _adopt(self, job: JobCandidate) -> None:
        self.job = job
        workers = {}
        for m in job.members:
            if m.role != "worker":
                continue
            rank = m.rank if m.rank is not None else m.spawn_index
            workers[m.pid] = Worker(m.pid, f"rank {rank}" if rank is not None else f"pid {m.pid}",
                                    procs.read_environ(m.pid)[0])
        self.workers = workers
        agent = job.launcher_pid if job.launcher == "torchrun" else None
        for path in probe.job_log_files(list(job.pids), agent):
            self.tail.add(path)
        for given in self.opts.logs:
            files = sorted(p for p in Path(given).rglob("*") if p.is_file()) \
                if Path(given).is_dir() else [Path(given)]
            for path in files[:500]:
                self.tail.add(str(path))

    def _launcher_exit(self) -> tuple[bool, int | None]:
        """(ended, exit code if known)."""
        assert self.job is not None
        if self.child is not None:
            code = self.child.poll()
            return code is not None, code
        u = probe.usage(self.job.launcher_pid)
        if u is None:
            return True, None
        return u.state in ("Z", "X"), u.exit_code

    def _tick(self) -> int | None:
        assert self.detector is not None and self.job is not None
        det, now = self.detector, time.monotonic()
        if self.meeting is not None:
            self.meeting.heartbeat()
            for trig in self.meeting.pending():
                self._remote_trigger(trig)
        gone = []
        for pid, w in self.workers.items():
            u = probe.usage(pid)
            if u is None or u.state in ("Z", "X"):
                gone.append(pid)
                self.exit_codes[w.key] = u.exit_code if u else None
            else:
                det.usage(now, pid, u)
        grown, alerts = self.tail.poll()
        det.logs(now, grown)
        for path, line in alerts[:20]:
            self.event("alert", f"{os.path.basename(path)}: {line.strip()}", path=path)
        ended, code = self._launcher_exit()
        if gone or ended:
            result = self._job_changed(gone, ended, code)
            if result is not None:
                return result
            return None
        if self.workers and det.sample_due(now):
            self._sample(now)
        status = det.status(time.monotonic())
        self._report(status)
        if self.kill_at is not None and not det.hung:
            self.event("kill_cancelled", "the job made progress again: not ending it")
            self.kill_at = None
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self._kill()
        return None

    def _sample(self, now: float) -> None:
        assert self.detector is not None
        pids = list(self.workers)
        samples = dict(zip(pids, self.pool.map(
            lambda pid: probe.sample(self.pyspy_exe, pid, self.opts.step_timeout_s,
                                     self.workers[pid].env), pids),
            strict=True))
        self.rounds.append((time.time(), {pid: s.raw for pid, s in samples.items() if s.raw}))
        self._own_output(now, samples)
        moved = self.detector.stacks(now, samples)
        self.event("sample", None, moved=[t.key for t in moved],
                   where={self.workers[p].key: s.where or s.status for p, s in samples.items()})

    def _own_output(self, now: float, samples: dict[int, probe.Sample]) -> None:
        """A faulthandler sample writes its dump into the job's log: that growth is ours, not
        the job's progress. The followed sizes move past it; the job's own lines that landed in
        the same window still count."""
        assert self.detector is not None
        foreign = 0
        # in the order the dumps were written (one at a time), so one rank's dump is not
        # taken for the job's output before the next one
        for w in sorted((w for s in samples.values() for w in s.written),
                        key=lambda w: (w.path, w.start)):
            unseen = self.tail.skip(w.path, w.start, w.end)
            if unseen is not None:
                foreign += unseen + w.foreign
        if foreign:
            self.detector.logs(now, foreign)
        alt = next((s for s in samples.values() if s.source != "py-spy"), None)
        if alt is not None and not self.fallback_noted:
            self.fallback_noted = True
            self.event("fallback", f"stack samples not from py-spy: {alt.note}",
                       source=alt.source, ranks=[self.workers[p].key for p, s in samples.items()
                                                 if s.source != "py-spy"])

    def _report(self, st: Status) -> None:
        if st.fallback:
            self.event("fallback", st.fallback)
        if st.busy_notice:
            self.event("busy", st.busy_notice, ranks=[t.key for t in st.busy])
        if st.state == "hung":
            self.found_problem = True
            self.hangs += 1
            where = {t.key: t.where for t in self.detector.ranks.values()} \
                if self.detector else {}
            self.event("hang", f"HANG: {st.reason}", reason=st.reason, where=where)
            for key, w in sorted(where.items()):
                self.echo(f"    {key}: {w or 'stack unknown'}")
            self._on_hang(st.reason)

    # -- hang -------------------------------------------------------------------------------
    def _on_hang(self, reason: str) -> None:
        tid = None
        if self.meeting is not None:
            tid = self.meeting.recent(self.opts.hang_after)
            if tid is not None:
                self.event("already_collected", f"already collected for trigger {tid}")
                self._arm_kill()
                return
            tid = self.meeting.trigger(reason)
            self.event("trigger", f"trigger {tid} written to {self.opts.shared_dir}",
                       trigger=tid)
        out = self.meeting.bundle_dir(tid) if self.meeting and tid else \
            self.out / f"hang-{self.hangs}" / "bundle"
        bundle = self._collect(out, {"event": "hang", "reason": reason, "trigger": tid},
                               snapshots=True)
        if bundle is not None:
            paths = [bundle]
            if self.meeting is not None and tid is not None:
                paths = self.meeting.wait_for_bundles(tid, self.opts.deadline_s + 10) or paths
            self._analyze(paths, out.parent, bundle)
            self._upload(bundle)
            self._hook(bundle, reason)
        self._arm_kill()

    def _remote_trigger(self, trig: dict[str, Any]) -> None:
        assert self.meeting is not None
        tid = str(trig.get("id"))
        self.event("remote_trigger", f"node {trig.get('node')} triggered ({trig.get('reason')}):"
                   " collecting here too", trigger=tid, node=trig.get("node"))
        self._collect(self.meeting.bundle_dir(tid),
                      {"event": "remote_trigger", "trigger": tid, "from": trig.get("node"),
                       "reason": trig.get("reason")}, snapshots=True)

    def _arm_kill(self) -> None:
        if self.opts.kill_after is not None and self.kill_at is None:
            self.kill_at = time.monotonic() + self.opts.kill_after
            self.event("kill_scheduled", f"ending the job in {self.opts.kill_after:g}s unless "
                       "it makes progress (--kill-after)")

    def _collect(self, out: Path, watch: dict[str, Any], *, snapshots: bool) -> Path | None:
        """One ``collect`` of the job into ``out`` (the same code as ``ddp-autopsy collect``),
        plus the watcher's facts and earlier stack samples."""
        assert self.job is not None
        t0 = time.monotonic()
        copts = CollectOptions(out=out, logs=[Path(p) for p in self.tail.sizes],
                               deadline_s=self.opts.deadline_s,
                               step_timeout_s=self.opts.step_timeout_s,
                               # its own rounds are the earlier samples when it keeps them
                               samples=1 if snapshots and self.rounds else CollectOptions.samples)
        try:
            job = self.job
            with contextlib.suppress(CollectError):  # DataLoader workers come and go
                if procs.exists(self.job.launcher_pid):
                    job = job_for_pid(self.job.launcher_pid)
            out.parent.mkdir(parents=True, exist_ok=True)
            result = collect_job(job, copts)
        except Exception as exc:  # the watcher goes on; the reason is in the events
            self.event("collect_failed", f"collect failed: {type(exc).__name__}: {exc}")
            return None
        watch = {**watch, "node": self.node, "exit_codes": self.exit_codes,
                 "hang_after": self.opts.hang_after}
        self._extend_manifest(result.bundle, watch, snapshots)
        self.event("collected", f"bundle {result.bundle} ({time.monotonic() - t0:.1f}s)",
                   bundle=str(result.bundle), seconds=time.monotonic() - t0,
                   warnings=result.warnings)
        return result.bundle

    def _extend_manifest(self, bundle: Path, watch: dict[str, Any], snapshots: bool) -> None:
        """Add ``watch`` and ``snapshots`` (docs/watch.md) to the bundle's manifest."""
        path = bundle / layout.MANIFEST
        man = json.loads(path.read_text())
        entries = []
        for i, (taken, raws) in enumerate(self.rounds if snapshots else ()):
            stacks = {}
            for pid, raw in raws.items():
                rel = f"{layout.SNAPSHOTS}/{i}/{pid}/stack.json"
                try:
                    doc = redact_obj(json.loads(raw))
                except ValueError:
                    continue
                (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
                (bundle / rel).write_text(json.dumps(doc))
                stacks[str(pid)] = rel
            entries.append({"index": i, "taken": datetime.fromtimestamp(
                taken, timezone.utc).isoformat(), "stacks": stacks})
        man["watch"] = watch
        # the watcher's rounds came first; collect's own quick samples follow them
        later = [e for e in man.get("snapshots") or [] if isinstance(e, dict)]
        if entries or later:
            man["snapshots"] = [{**e, "index": i} for i, e in enumerate(entries + later)]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(man, indent=2))
        os.replace(tmp, path)

    def _analyze(self, paths: list[Path], report_dir: Path, bundle: Path | None) -> None:
        """The analysis ``analyze`` would print, plus which ranks moved between snapshots."""
        from ddp_autopsy.analyzer import snapshots
        from ddp_autopsy.analyzer.job import load
        from ddp_autopsy.analyzer.sources import iter_inputs
        from ddp_autopsy.reports import html, json_report, text
        from ddp_autopsy.rules.engine import run

        t0 = time.monotonic()
        try:
            # bundles of the same processes (two watchers of one job on one host, or a bundle
            # collected twice) are folded into one set of processes
            job, repeated = snapshots.merge_repeated(load(paths))
            analysis = run(job)
            buf = io.StringIO()
            text.render(analysis, out=buf, color=self.opts.color)
            report_dir.mkdir(parents=True, exist_ok=True)
            # The report lies in the bundle: redacted, like everything a bundle holds.
            (report_dir / "report.json").write_text(json_report.render(analysis, redact=True))
            (report_dir / "report.html").write_text(html.render(analysis), encoding="utf-8")
        except Exception as exc:
            self.event("analyze_failed", f"analysis failed: {type(exc).__name__}: {exc}")
            return
        moves: list[snapshots.Movement] = repeated
        if bundle is not None and not moves:
            for _path, tree in iter_inputs([bundle], []):
                man = json.loads(tree.read_bytes(layout.MANIFEST) or b"{}")
                moves = snapshots.movement(snapshots.read_tree(tree, man))
        v = analysis.verdict
        self.echo(buf.getvalue().rstrip())
        if moves:
            self.echo("Between snapshots: " + snapshots.summary(moves))
            for m in moves:
                self.echo("  " + m.describe())
        self.event("verdict", f"report {report_dir / 'report.html'}",
                   cause=v.cause if v else None, ranks=v.ranks if v else [],
                   summary=v.summary if v else None, seconds=time.monotonic() - t0,
                   report=str(report_dir / "report.json"),
                   moved=[m.rank for m in moves if m.moved and m.rank is not None],
                   still=[m.rank for m in moves if not m.moved and m.rank is not None])

    def _upload(self, path: Path) -> None:
        """Send the bundle (or the kept logs) to the post-mortem service, as
        ``ddp-autopsy upload`` does; a failure is reported, never fatal."""
        if not self.opts.upload:
            return
        try:
            from ddp_autopsy.server.client import UploadError, upload
        except ImportError as exc:  # httpx: the server extra
            self.event("upload_failed", f"upload not possible: {exc} (pip install "
                       "'ddp-autopsy[server]')")
            return
        try:
            answer = upload(path, self.opts.upload, self.opts.upload_token,
                            timeout=self.opts.deadline_s)
        except (UploadError, ImportError) as exc:
            self.event("upload_failed", f"upload failed: {exc}")
            return
        self.event("uploaded", f"uploaded: {answer.get('url')}", url=answer.get("url"),
                   incident=answer.get("incident"))

    def _hook(self, bundle: Path, reason: str) -> None:
        if not self.opts.on_hang:
            return
        env = {**os.environ, "DDP_AUTOPSY_BUNDLE": str(bundle), "DDP_AUTOPSY_REASON": reason,
               "DDP_AUTOPSY_REPORT": str(bundle.parent / "report.json")}
        try:
            done = subprocess.run(self.opts.on_hang, shell=True, env=env, timeout=60,
                                  check=False, stdin=subprocess.DEVNULL)
            self.event("hook", f"--on-hang exited with {done.returncode}",
                       code=done.returncode)
        except subprocess.TimeoutExpired:
            self.event("hook", "--on-hang did not finish within 60s (killed)", code=None)

    # -- ending the job ---------------------------------------------------------------------
    def _kill(self) -> None:
        """SIGTERM to the launcher (torchrun stops its ranks; the scheduler sees a clean end),
        then to ranks still alive, SIGKILL after the grace."""
        assert self.job is not None
        self.kill_at = None
        self.killed = True
        self.event("kill", f"ending the job: SIGTERM to the launcher (pid "
                   f"{self.job.launcher_pid})")
        self._signal([self.job.launcher_pid], signal.SIGTERM)
        if self._wait_gone(KILL_GRACE_S):
            return
        self._signal(list(self.workers), signal.SIGTERM)
        if not self._wait_gone(KILL_GRACE_S / 2):
            self._signal([self.job.launcher_pid, *self.workers], signal.SIGKILL)
            self._wait_gone(5)

    def _after_once(self) -> int:
        """--once: stop watching. ``run`` still waits for its job (and returns its code)."""
        self.event("stopped", "stopped watching after the first hang (--once)")
        if self.child is None:
            return 1
        while self.child.poll() is None:
            if self.stop.wait(0.5):
                return 130
        return self._exit_code(self.child.returncode)

    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            if self.child is not None and pid == self.child.pid:
                with contextlib.suppress(ProcessLookupError):
                    self.child.send_signal(sig)
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _wait_gone(self, timeout: float) -> bool:
        assert self.job is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ended, _ = self._launcher_exit()
            alive = [p for p in self.workers if (u := probe.usage(p)) is not None
                     and u.state not in ("Z", "X")]
            if ended and not alive:
                return True
            time.sleep(0.2)
        return False

    def _job_changed(self, gone: list[int], ended: bool, code: int | None) -> int | None:
        """Ranks exited or the launcher ended: a restart (new ranks), or the end of the job."""
        assert self.job is not None and self.detector is not None
        if not ended:
            # the launcher is alive: torchrun restarts ranks, or is about to exit
            with contextlib.suppress(CollectError):
                job = job_for_pid(self.job.launcher_pid)
                new = {m.pid for m in job.members if m.role == "worker"} - set(self.workers)
                if new:
                    self.event("restart", f"ranks exited ({', '.join(sorted(self.exit_codes))})"
                               "; the launcher started new ones", exit_codes=self.exit_codes)
                    for pid in list(self.workers):
                        self.detector.forget(pid)
                    self._adopt(job)
                    for w in self.workers.values():
                        self.detector.track(w.pid, w.key)
                    return None
            for pid in gone:
                self.workers.pop(pid, None)
                self.detector.forget(pid)
            if self.workers:
                return None  # the others are probably going too: next tick
            deadline = time.monotonic() + KILL_GRACE_S
            while time.monotonic() < deadline and not self.stop.is_set():
                ended, code = self._launcher_exit()
                if ended:
                    break
                time.sleep(0.2)
            if not ended:
                return None
        if self.child is not None:
            code = self.child.wait()
        known = [c for c in self.exit_codes.values() if c is not None]
        failed = (code is not None and code != 0) or any(c != 0 for c in known)
        clean = code == 0 and not failed
        desc = f"exit code {code}" if code is not None else "exit code unknown (not our child)"
        self.event("ended", f"the job ended: {desc}", exit_code=code,
                   exit_codes=self.exit_codes, killed=self.killed)
        if self.killed or clean:
            return self._exit_code(code)
        self.found_problem = self.found_problem or failed
        self._postmortem(code)
        return self._exit_code(code)

    def _postmortem(self, code: int | None) -> None:
        """The job is gone: keep its logs (copied redacted, size-capped, as collect copies them)
        and exit codes under ``<out>/postmortem/``, and analyze them."""
        from ddp_autopsy.collectors.logs import MAX_LOG_BYTES, bundle_path_for, copy_log

        root = self.out / "postmortem"
        kept = []
        for src in self.tail.sizes:
            dest = root / bundle_path_for(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                copy_log(src, dest, limit=MAX_LOG_BYTES,
                         stop_at=time.monotonic() + self.opts.step_timeout_s)
            except OSError as exc:
                self.event("log_not_kept", f"log not kept: {src}: {exc.strerror or exc}")
                continue
            kept.append(dest)
        root.mkdir(parents=True, exist_ok=True)
        (root / "exit_codes.json").write_text(json.dumps(
            {"launcher": code, "ranks": self.exit_codes}, indent=2))
        self.event("postmortem", f"kept {len(kept)} log file(s) in {root}", logs=len(kept))
        if kept:
            self._analyze([root / "logs"], root, None)
            self._upload(root / "logs")

    def _exit_code(self, code: int | None) -> int:
        if self.child is not None:
            return code if code is not None and code >= 0 else 128 + abs(code or 0)
        return 1 if self.found_problem else 0


def _local_world(pids: list[int]) -> int:
    """The ranks this node's launcher starts (``LOCAL_WORLD_SIZE`` of its workers; torchrun sets
    it), or 0 when unknown (mp.spawn)."""
    for pid in pids:
        value = (procs.read_environ(pid)[0] or {}).get("LOCAL_WORLD_SIZE", "")
        if value.isdigit():
            return int(value)
    return 0


class _Ended(Exception):
    """The launched job exited before it started ranks."""

    def __init__(self, code: int) -> None:
        super().__init__(f"the job exited with code {code} before it started any rank")
        self.code = code
