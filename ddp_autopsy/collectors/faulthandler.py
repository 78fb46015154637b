"""Stacks from the job's own ``faulthandler``, when py-spy cannot take them.

A job that called ``faulthandler.register(signal.SIGUSR1, all_threads=True)`` prints every
thread's Python stack when it receives SIGUSR1, to the file it gave (``sys.stderr`` by default).
That works on any CPython, in a thread blocked in C, without ptrace. But a signal sent to a process
that did *not* register a handler for it kills the process (SIGUSR1's default action), and a
handler the job installed for other reasons (a requeue on SIGUSR1) would run. So the signal is
used only when

* the job **declares** it: ``DDP_AUTOPSY_FAULTHANDLER=SIGUSR1`` (or ``USR1``, ``10``) in the
  job's environment (read from ``/proc/PID/environ``), or in the environment of the tool (the
  user knows the job registered it); and
* ``/proc/PID/status`` ``SigCgt`` shows a handler for that signal in the process (a process that
  inherited the variable without registering anything is never signalled).

Where the dump goes is read from ``/proc/PID/fd``: every regular file the process holds open for
writing is measured before the signal; the bytes they gain after it are searched for the dump.
Output to a pipe or a terminal cannot be read back: then nothing is sent, and the reason says so.

Dumps are taken one at a time (a lock in this process and a lock file for other tools), so
ranks that share one log file do not interleave. The dump format (CPython 3.8 to 3.13)::

    Thread 0x00007efd896386c0 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 320 in wait
      File "train.py", line 5 in worker

    Current thread 0x00007efd89e27b80 (most recent call first):
      File "train.py", line 8 in inner
      File "train.py", line 10 in <module>

CPython lists the newest thread first, so the **last** thread is the main thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_autopsy.collectors import procs

ENV_VAR = "DDP_AUTOPSY_FAULTHANDLER"
QUIET_S = 0.15  # the dump is complete once its file stopped growing this long
POLL_S = 0.02
MAX_READ = 4 << 20  # bytes read back from one file after the signal

THREAD_RE = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+)"
                       r"(?: \[(?P<name>[^\]]*)\])?.*\(most recent call first\):\s*$")
FRAME_RE = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<func>.+?)\s*$')
_SHORT = re.compile(r".*/(?:site-packages|dist-packages|lib/python\d+\.\d+t?)/")

_lock = threading.Lock()  # one dump at a time in this process (ranks share log files)
# processes that gave no dump after a signal: not signalled again (a watcher samples every
# round; each silent attempt would cost its whole timeout). Keyed by (pid, start time).
_silent: dict[tuple[int, int], str] = {}


@dataclass
class Written:
    """What one dump added to one of the job's files."""

    path: str
    start: int  # the file's size when the signal was sent
    end: int  # its size after the dump
    foreign: int  # bytes in between that were not the dump (the job's own output)


@dataclass
class Dump:
    """The outcome of one attempt: ``threads`` in py-spy's ``dump --json`` shape when ``ok``."""

    status: str  # ok | unavailable (nothing sent) | exited | error
    detail: str  # how it was taken, or why not
    threads: list[dict[str, Any]] | None = None
    text: str | None = None  # the raw faulthandler output
    signal: str | None = None
    written: list[Written] = field(default_factory=list)
    method: str = "faulthandler"  # or profiling.sampling (collectors.pyspy.sampling_dump)


def parse_signal(value: str) -> int | None:
    """``SIGUSR1`` / ``usr1`` / ``10`` → 10; None for anything else, and for the signals that
    mean something else to a job (SIGINT is caught by every Python process: it would raise
    KeyboardInterrupt). Accepted: SIGUSR1, SIGUSR2 and the real-time signals."""
    v = value.strip().upper()
    if v.isdigit():
        sig = int(v)
    else:
        name = v if v.startswith("SIG") else f"SIG{v}"
        found = getattr(signal.Signals, name, None) if name.isidentifier() else None
        sig = int(found) if found is not None else 0
    usable = sig in (signal.SIGUSR1, signal.SIGUSR2) or \
        signal.SIGRTMIN <= sig <= signal.SIGRTMAX
    return sig if usable else None


def declared(env: Mapping[str, str] | None,
             own: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """The signal the job declared (its environment first, then the tool's), and who said so."""
    for where, source in (("the job's environment", env), ("the tool's environment", own)):
        value = (source or {}).get(ENV_VAR)
        if value:
            sig = parse_signal(value)
            if sig is None:
                return None, (f"{ENV_VAR}={value!r} in {where} is not SIGUSR1, SIGUSR2 or a "
                              "real-time signal")
            return sig, where
    return None, f"no faulthandler signal declared ({ENV_VAR} is not set)"


def caught(pid: int, sig: int) -> bool | None:
    """Whether ``pid`` has a handler for ``sig`` (``SigCgt``); None when it cannot be read."""
    try:
        text = (procs.PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return None


def _writable_files(pid: int) -> tuple[dict[int, tuple[str, int]], list[str]]:
    """``({fd: (path, size)}, [other targets of fds 1 and 2])``: the regular files ``pid`` holds
    open for writing, and where its stdout/stderr go when they are not such files."""
    files: dict[int, tuple[str, int]] = {}
    seen: set[tuple[int, int]] = set()  # stdout and stderr are often one file: read it once
    others = []
    base = procs.PROC / str(pid)
    try:
        fds = [int(n) for n in os.listdir(base / "fd") if n.isdigit()]
    except OSError:
        return files, others
    for fd in sorted(fds):
        try:
            st = os.stat(base / "fd" / str(fd))
            target = os.readlink(base / "fd" / str(fd))
            flags = next((int(line.split()[1], 8) for line in
                          (base / "fdinfo" / str(fd)).read_text().splitlines()
                          if line.startswith("flags:")), 0)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) and flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                files[fd] = (target, st.st_size)
        elif fd in (1, 2):
            others.append(f"fd {fd} → {target}")
    return files, others


def _size(pid: int, fd: int) -> int | None:
    try:
        return os.stat(procs.PROC / str(pid) / "fd" / str(fd)).st_size
    except OSError:
        return None


def _read(pid: int, fd: int, path: str, start: int, end: int) -> bytes:
    start = max(start, end - MAX_READ)
    for src in (str(procs.PROC / str(pid) / "fd" / str(fd)), path):
        with contextlib.suppress(OSError), open(src, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)
    return b""


@contextlib.contextmanager
def _serialized() -> Any:
    """One dump at a time, in this process and across tools on this host."""
    with _lock:
        path = os.path.join(tempfile.gettempdir(), "ddp-autopsy-faulthandler.lock")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            fd = None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock


def take(pid: int, env: Mapping[str, str] | None, timeout: float = 5.0,
         own_env: Mapping[str, str] | None = None) -> Dump:
    """Trigger the job's faulthandler in ``pid`` and read its dump back (see the module doc).
    ``env``: the process's environment (read from ``/proc`` when None)."""
    own_env = os.environ if own_env is None else own_env
    if env is None:
        env = procs.read_environ(pid)[0]
    sig, who = declared(env, own_env)
    if sig is None:
        return Dump("unavailable", who)
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = str(sig)
    has = caught(pid, sig)
    if has is None:
        return Dump("exited" if not procs.exists(pid) else "error",
                    f"cannot read /proc/{pid}/status", signal=name)
    if not has:
        return Dump("unavailable", f"{name} is declared ({who}) but pid {pid} has no handler "
                    "for it (faulthandler.register was not called there); not sent, it "
                    "would kill the process", signal=name)
    started = procs.read_stat(pid)
    key = (pid, started[2] if started else 0)
    if key in _silent:
        return Dump("error", _silent[key] + " (not sent again)", signal=name)
    files, others = _writable_files(pid)
    if not files:
        where = "; ".join(others) or "no file"
        return Dump("unavailable", f"pid {pid} writes to no regular file ({where}): its "
                    f"faulthandler output could not be read back; {name} not sent", signal=name)
    active = procs.read_state(pid) == "R"
    end = time.monotonic() + timeout
    with _serialized():
        before = {fd: (path, _size(pid, fd)) for fd, (path, _s) in files.items()}
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return Dump("exited", "process exited before the signal", signal=name)
        except PermissionError:
            return Dump("error", f"not permitted to send {name} to pid {pid} (run as the "
                        "job's user)", signal=name)
        text, written = _collect(pid, before, end)
    threads = parse(text, pid, main_active=active)
    sent = f"faulthandler ({name}, declared in {who})"
    if not threads:
        if not procs.exists(pid):
            return Dump("exited", "process exited during the faulthandler dump", signal=name)
        why = (f"{name} sent, but no faulthandler dump appeared within {timeout:g}s in "
               f"{', '.join(sorted({p for p, _ in files.values()}))}")
        _silent[key] = why
        return Dump("error", why, signal=name, written=written)
    into = ", ".join(w.path for w in written if w.end) or "?"
    return Dump("ok", f"{sent}, written into {into}", threads, text, name, written)


def _collect(pid: int, before: dict[int, tuple[str, int | None]],
             end: float) -> tuple[str, list[Written]]:
    """Read what the files gained after the signal until the dump is complete (or ``end``)."""
    sizes = {fd: s for fd, (_p, s) in before.items() if s is not None}
    chunks: dict[int, bytes] = {fd: b"" for fd in sizes}
    dumped, last_growth = 0, 0.0  # dump bytes seen, when they last grew (the job may go on
    while True:                   # writing its own lines meanwhile)
        now = time.monotonic()
        for fd in sizes:
            size = _size(pid, fd)
            seen = sizes[fd] + len(chunks[fd])
            if size is not None and size > seen:
                chunks[fd] += _read(pid, fd, before[fd][0], seen, size)
        total = sum(_dump_bytes(c) for c in chunks.values()
                    if b"(most recent call first):" in c)
        if total > dumped:
            dumped, last_growth = total, now
        if (dumped and now - last_growth >= QUIET_S) or now >= end:
            break
        time.sleep(POLL_S)
    best = max(chunks, key=lambda fd: _dump_bytes(chunks[fd]), default=None)
    written = []
    for fd, data in chunks.items():
        if data:
            own = _dump_bytes(data) if fd == best else 0
            written.append(Written(before[fd][0], sizes[fd], sizes[fd] + len(data),
                                   len(data) - own))
    text = chunks[best].decode(errors="replace") if best is not None else ""
    return text, written


def _dump_bytes(data: bytes) -> int:
    """How many bytes of ``data`` are faulthandler lines (headers, frames, their blank lines)."""
    n = 0
    for line in data.decode(errors="replace").splitlines(keepends=True):
        s = line.rstrip("\n")
        if THREAD_RE.match(s) or FRAME_RE.match(s) or s.strip() in ("", "...", "<no Python frame>"):
            n += len(line.encode())
    return n


def short_filename(path: str) -> str:
    """As py-spy shortens: relative to site-packages or the standard library, else the name."""
    short = _SHORT.sub("", path)
    return os.path.basename(short) if short == path and os.path.isabs(path) else short


def parse(text: str, pid: int | None, *, main_active: bool = False) -> list[dict[str, Any]]:
    """faulthandler's output as py-spy ``dump --json`` threads (innermost frame first). Lines
    that are not part of a dump (other ranks' output in a shared log) are skipped; when the text
    holds several dumps, the last one is kept."""
    threads: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        m = THREAD_RE.match(raw)
        if m:
            ident = int(m.group("id"), 16)
            if any(t["thread_id"] == ident for t in threads):
                threads = []  # a second dump starts
            current = {"pid": pid, "thread_id": ident, "thread_name": m.group("name"),
                       "os_thread_id": None, "active": False,
                       "owns_gil": False, "frames": [], "source": "faulthandler"}
            threads.append(current)
            continue
        f = FRAME_RE.match(raw)
        if f and current is not None:
            path = f.group("file")
            current["frames"].append({
                "name": f.group("func"), "filename": path,
                "short_filename": short_filename(path), "module": None,
                "line": int(f.group("line")) if f.group("line").isdigit() else None})
        elif not raw.strip():
            current = None
    if threads:  # CPython lists the newest thread first: the main thread is the last one
        main = threads[-1]
        main["os_thread_id"], main["active"] = pid, main_active
        main["thread_name"] = main["thread_name"] or "MainThread"
    return threads
