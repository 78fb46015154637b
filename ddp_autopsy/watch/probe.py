"""What the watcher reads from a running job without instrumenting it, each read cheap:

* CPU time (``utime + stime``) and I/O bytes (``rchar + wchar``) per rank from ``/proc``;
* the size of the job's log files (growth is progress) and the lines they gained (watchdog and
  timeout lines are reported as they appear);
* one non-blocking py-spy sample of a rank (``--nonblocking``: the process is never paused),
  reduced to a *signature* that changes when the rank's main thread moves; when py-spy fails,
  the same fallbacks as ``collect`` (:func:`ddp_autopsy.collectors.pyspy.fallback`: the 3.15+
  interpreter's own dump, or the job's faulthandler).

Nothing here raises for a process that vanished: readers return ``None``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddp_autopsy.analyzer.snapshots import frame_signature, frames_where, main_thread
from ddp_autopsy.collectors import procs, pyspy
from ddp_autopsy.collectors.faulthandler import Written

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Lines worth printing the moment they appear (NCCL / torch watchdogs, Gloo timeouts, crashes).
ALERT_RE = re.compile(
    r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*(?:timeout|Timeout)|"
    r"Timed out|timed out|Connection closed by peer|ChildFailedError|"
    r"Traceback \(most recent call last\)|exitcode\s*:\s*-?\d|SIGTERM|Signals\.SIG|"
    r"heartbeat monitor|Terminating the process", re.I)
MAX_ALERT_LINE = 300
# Frames that mean "waiting for the other ranks".
COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py",
                    "torch/distributed/utils.py")


@dataclass(frozen=True)
class Usage:
    """Cumulative CPU seconds and I/O bytes of one process; ``state`` is its /proc state."""

    cpu_s: float
    io_bytes: int | None
    state: str
    exit_code: int | None = None  # a zombie's exit status (field 52), else None


def usage(pid: int) -> Usage | None:
    """``/proc/PID/stat`` (and ``io`` when readable); ``None`` once the process is gone."""
    try:
        raw = (procs.PROC / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    try:
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: stat fields 14, 15
        state = fields[0]
    except (IndexError, ValueError):
        return None
    exit_code = None
    if state in ("Z", "X") and len(fields) >= 50:
        status = int(fields[49]) if fields[49].lstrip("-").isdigit() else None
        if status is not None:  # waitpid format: a signal in the low bits, else the code
            exit_code = -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
    return Usage(cpu, _io_bytes(pid), state, exit_code)


def _io_bytes(pid: int) -> int | None:
    try:
        text = (procs.PROC / str(pid) / "io").read_text()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar"):
            total += int(value)
    return total


class LogTail:
    """Follows a set of files: their total growth, and the new lines matching :data:`ALERT_RE`."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def add(self, path: str) -> None:
        path = os.path.realpath(path)  # one key per file, however it was named
        if path not in self.sizes:
            try:
                self.sizes[path] = os.path.getsize(path)
            except OSError:
                self.sizes[path] = 0

    def skip(self, path: str, start: int, end: int) -> int | None:
        """Bytes ``start..end`` of ``path`` were written because of the watcher (a faulthandler
        dump): count the file as read past them. Returns the bytes the job wrote before
        ``start`` that the next poll would have seen (None when ``path`` is not followed)."""
        path = os.path.realpath(path)
        if path not in self.sizes:
            return None
        unseen = max(0, start - self.sizes[path])
        self.sizes[path] = max(self.sizes[path], end)
        return unseen

    def poll(self, max_read: int = 1 << 20) -> tuple[int, list[tuple[str, str]]]:
        """``(bytes gained since the last poll, [(path, alert line)])``."""
        grown, alerts = 0, []
        for path, old in list(self.sizes.items()):
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size < old:  # truncated or rotated: start over
                old = 0
            if size > old:
                grown += size - old
                alerts += [(path, line) for line in _new_lines(path, old, size, max_read)
                           if ALERT_RE.search(line)]
            self.sizes[path] = size
        return grown, alerts


def _new_lines(path: str, start: int, end: int, max_read: int) -> list[str]:
    start = max(start, end - max_read)  # a burst: only its tail is scanned
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
    except OSError:
        return []
    return [line[:MAX_ALERT_LINE] for line in data.decode(errors="replace").splitlines()]


def job_log_files(pids: list[int], agent_pid: int | None) -> list[str]:
    """Regular files the job's processes write their stdout/stderr to, and the files of
    torchrun's ``--log-dir`` (what ``collect`` copies too)."""
    from ddp_autopsy.collectors.logs import log_dirs_from_cmdline

    found: dict[str, None] = {}
    for pid in pids:
        for fd in (1, 2):
            target = procs.fd_target(pid, fd)
            if target and target.startswith("/") and not target.endswith(" (deleted)") \
                    and os.path.isfile(target):
                found.setdefault(target, None)
    if agent_pid is not None:
        cmdline = procs.read_cmdline(agent_pid) or ()
        for log_dir in log_dirs_from_cmdline(cmdline, procs.read_cwd(agent_pid)):
            for path in sorted(Path(log_dir).rglob("*.log"))[:200]:
                if path.is_file():
                    found.setdefault(str(path), None)
    return list(found)


@dataclass(frozen=True)
class Sample:
    """One py-spy sample of one process."""

    pid: int
    status: str  # ok | exited | permission_denied | not_python | timeout | error
    signature: str | None = None  # changes when the main thread moves
    where: str | None = None  # "all_reduce (distributed_c10d.py:2501) < main (job.py:40)"
    in_collective: bool = False
    raw: bytes | None = None  # the --json document, kept for the bundle's snapshots
    error: str | None = None
    python: str | None = None  # the interpreter version, when py-spy could not read it
    source: str = "py-spy"  # or the fallback that took it (faulthandler, profiling.sampling)
    note: str | None = None  # a fallback's sample: why py-spy failed and how it was taken
    written: tuple[Written, ...] = ()  # what a faulthandler dump added to the job's files


def in_collective(frames: list[dict[str, Any]]) -> bool:
    return any(str(f.get("filename", "")).endswith(COLLECTIVE_FILES) for f in frames)


def sample(pyspy_exe: str | None, pid: int, timeout: float = 5.0,
           env: Mapping[str, str] | None = None) -> Sample:
    """One ``py-spy dump --json --nonblocking`` of ``pid``, reduced to its signature; when
    py-spy fails (but the process lives), a fallback stack (``env``: the process's own)."""
    got = _pyspy_sample(pyspy_exe, pid, timeout)
    if got.status in ("ok", "exited"):
        return got
    alt = pyspy.fallback(pid, env, timeout)
    if alt.status == "exited":
        return Sample(pid, "exited", error="process exited")
    if alt.status != "ok" or not alt.threads:
        return replace(got, error=f"{got.error}; no fallback stack: {alt.detail}")
    return replace(_reduce(pid, alt.threads, json.dumps(alt.threads).encode()),
                   source=alt.method, written=tuple(alt.written),
                   note=f"py-spy failed ({got.status}: {got.error}); stack taken with "
                        f"{alt.detail}")


def _pyspy_sample(pyspy_exe: str | None, pid: int, timeout: float) -> Sample:
    if pyspy_exe is None:
        return Sample(pid, "error", error="py-spy not found (pip install py-spy)")
    argv = pyspy.dump_argv(pyspy_exe, pid, as_json=True, native=False)
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Sample(pid, "timeout", error=f"py-spy did not finish within {timeout}s")
    except OSError as exc:
        return Sample(pid, "error", error=str(exc))
    kept = pyspy.keep_call_args(out.stdout) if out.returncode == 0 else b""
    threads = json.loads(kept) if kept else None
    if not isinstance(threads, list):
        return _failed(pid, out.stderr.decode(errors="replace"), out.returncode)
    return _reduce(pid, threads, kept)


def _reduce(pid: int, threads: list[Any], raw: bytes) -> Sample:
    th = main_thread(threads, pid)
    frames = list(th.get("frames") or []) if th else []
    return Sample(pid, "ok", frame_signature(frames), frames_where(frames), in_collective(frames),
                  raw)


def _failed(pid: int, stderr: str, code: int | None = None) -> Sample:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = [next((line for line in lines if "rror" in line), lines[0] if lines else
                 f"py-spy exited with {code}")]
    if not procs.exists(pid) or procs.read_state(pid) in ("Z", "X"):
        return Sample(pid, "exited", error="process exited")
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return Sample(pid, "permission_denied", error=pyspy.PTRACE_REMEDY)
    version = pyspy.python_version(pid)
    return Sample(pid, "not_python" if "python" in low else "error", error=text[0][:300],
                  python=".".join(map(str, version)) if version else None)
