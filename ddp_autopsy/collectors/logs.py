"""Copying logs into ``logs/``: redacted, size-capped, originals never touched.

Sources: ``--logs`` paths (files or directories), the regular files the job's stdout/stderr point
to, and torchrun's ``--log-dir``. A file lands at ``logs/<its absolute path>`` (``/tmp/run/0.log``
→ ``logs/tmp/run/0.log``); a deleted file a process still writes to is read through
``/proc/PID/fd/N`` and lands at ``logs/deleted/<pid>-fd<N>-<name>``.

Files larger than the cap keep their head and tail around one marker line::

    [ddp-autopsy: 12345 bytes omitted from the middle of this file]
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ddp_autopsy.collectors.access import Access, Refused, reason
from ddp_autopsy.collectors.bundle import PERMISSION_DENIED, SKIPPED, Bundle
from ddp_autopsy.redact import StreamRedactor

MAX_LOG_BYTES = 64 << 20
MAX_DIR_FILES = 2000
CHUNK = 1 << 20
COPY_GRACE_S = 1.0


@dataclass
class LogSource:
    source: str  # the original path, as reported
    read_from: str  # where to read it (differs for deleted files)
    dest: str  # bundle-relative
    kinds: list[str] = field(default_factory=list)  # given | stdout | stderr | log_dir
    pids: list[int] = field(default_factory=list)


def bundle_path_for(source: str) -> str:
    parts = [p for p in Path(source).parts if p not in ("/", "..", ".")]
    return "logs/" + "/".join(parts)


def _walk(root: str, limit: int, access: Access, notes: list[str],
          refused: list[str]) -> list[str]:
    """Regular files below ``root``, at most ``limit``, in sorted order, without recursion (any
    depth). Directories are listed through ``access`` (what the job's user may list); symbolic
    links and special files (FIFOs, devices, sockets) are not followed nor read."""
    out: list[str] = []
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            names = access.listdir(top)
        except Refused as exc:
            refused.append(f"{top}: {reason(exc)}")
            continue
        except OSError as exc:
            notes.append(f"{top}: {reason(exc)}")
            continue
        subdirs = []
        for name in names:
            path = os.path.join(top, name)
            try:
                mode = os.stat(path, follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                subdirs.append(path)
            elif stat.S_ISREG(mode):
                out.append(path)
                if len(out) >= limit:
                    return out
        stack.extend(reversed(subdirs))
    return out


class LogPlan:
    """The deduplicated set of files to copy. Paths are read through ``access`` (what the job's
    own user may read); what it refuses is kept in ``refused``, other failures in ``notes``."""

    def __init__(self, access: Access | None = None) -> None:
        self.sources: dict[str, LogSource] = {}
        self.notes: list[str] = []
        self.refused: list[str] = []
        self.access = access or Access(None)

    def add_path(self, path: Path | str, kind: str, pid: int | None = None) -> None:
        """A file, or every regular file below a directory."""
        path = os.fspath(path)
        try:
            os.close(self.access.open(path, "file"))
        except Refused as exc:
            self.refused.append(f"{path}: {reason(exc)}")
            return
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a regular file (a directory?)
                self.notes.append(f"{path}: {reason(exc)}")
                return
        else:
            self._add(path, path, kind, pid)
            return
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except OSError as exc:
            self.notes.append(f"{path}: {reason(exc)}")
            return
        if not is_dir:
            self.notes.append(f"{path}: not a regular file or directory (skipped)")
            return
        files = _walk(path, MAX_DIR_FILES, self.access, self.notes, self.refused)
        if len(files) >= MAX_DIR_FILES:
            self.notes.append(f"{path}: more than {MAX_DIR_FILES} files, the rest not copied")
        for f in files:
            self._add(f, f, kind, pid)

    def add_fd(self, pid: int, fd: int, target: str | None, kind: str) -> None:
        """The file behind a process's stdout/stderr, if it is a regular file."""
        if not target or not target.startswith("/"):
            return  # pipe:[…], socket:[…], anon_inode
        if target.endswith(" (deleted)"):
            name = Path(target.removesuffix(" (deleted)")).name
            self._add(target, f"/proc/{pid}/fd/{fd}", kind, pid,
                      dest=f"logs/deleted/{pid}-fd{fd}-{name}")
            return
        try:
            if stat.S_ISREG(os.stat(target).st_mode):  # read (and checked) at copy time
                self._add(target, target, kind, pid)
        except OSError as exc:
            self.notes.append(f"{target} (fd {fd} of pid {pid}): {reason(exc)}")

    def _add(self, source: str, read_from: str, kind: str, pid: int | None,
             dest: str | None = None) -> None:
        key = source if read_from != source else os.path.realpath(source)
        entry = self.sources.get(key)
        if entry is None:
            entry = self.sources[key] = LogSource(source, read_from,
                                                  dest or bundle_path_for(key))
        if kind not in entry.kinds:
            entry.kinds.append(kind)
        if pid is not None and pid not in entry.pids:
            entry.pids.append(pid)


# torchrun options that take no value (every other option takes exactly one)
_AGENT_FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python",
                          "--run-path", "--run_path", "--use-env", "--use_env",
                          "--virtual-local-rank", "--virtual_local_rank", "-h", "--help"})
_AGENT_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _agent_args(args: list[str]) -> list[str]:
    """The arguments torchrun itself parses: those after ``torchrun`` / ``-m
    torch.distributed.run`` (the interpreter's own options come before)."""
    for i, arg in enumerate(args):
        if os.path.basename(arg) == "torchrun" or arg.endswith(("torch/distributed/run.py",
                                                                 "torch/distributed/launch.py")):
            return args[i + 1:]
        if arg == "-m" and i + 1 < len(args) and args[i + 1] in _AGENT_MODULES:
            return args[i + 2:]
    return args[1:]


def log_dirs_from_cmdline(cmdline: Iterable[str], cwd: str | None) -> list[Path]:
    """torchrun's ``--log-dir DIR`` / ``--log_dir=DIR`` (relative to the agent's cwd) as
    torchrun's parser resolves it: the last one given before the training script wins; those
    after the script are the script's own arguments. Empty, or one path."""
    args = _agent_args(list(cmdline))
    value: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if not arg.startswith("-") or arg == "-":
            break  # the training script
        if name in ("--log-dir", "--log_dir"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
        if not eq and arg not in _AGENT_FLAGS:
            i += 1  # the option's value
        i += 1
    if not value:
        return []
    path = Path(value)
    return [path if path.is_absolute() or not cwd else Path(cwd) / path]


@dataclass
class CopyResult:
    size: int  # of the source when copying started
    copied: int  # bytes read from the source
    truncated: bool
    stopped_early: bool  # the deadline or a cancel cut the copy short


def _next_line_start(fin: BinaryIO, pos: int) -> int:
    """The first line start at or after ``pos``."""
    if pos <= 0:
        return 0
    fin.seek(pos - 1)
    if fin.read(1) == b"\n":
        return pos
    fin.readline()
    return fin.tell()


def _head_end(fin: BinaryIO, limit: int) -> int:
    """The last line end within the first ``limit`` bytes (``limit`` itself if none)."""
    fin.seek(0)
    cut = fin.read(limit).rfind(b"\n")
    return cut + 1 if cut != -1 else limit


def _copy_span(fin: BinaryIO, fout: BinaryIO, start: int, end: int, redact: StreamRedactor,
               stop_at: float, chunk_size: int = CHUNK) -> tuple[int, bool]:
    """Copy ``[start, end)`` redacted; returns ``(bytes copied, stopped)``.

    Chunks are cut anywhere (even inside a UTF-8 character: surrogateescape keeps the bytes);
    the redactor holds an unfinished line back until its end arrives, so a secret cut by a chunk
    boundary is still seen whole.
    """
    fin.seek(start)
    pos = start
    stopped = False
    while pos < end:
        if time.monotonic() > stop_at:
            stopped = True
            break
        chunk = fin.read(min(chunk_size, end - pos))
        if not chunk:
            break
        pos += len(chunk)
        fout.write(redact(chunk.decode("utf-8", errors="surrogateescape"))
                   .encode("utf-8", errors="surrogateescape"))
    fout.write(redact.flush().encode("utf-8", errors="surrogateescape"))
    return pos - start, stopped


def copy_log(src: str, dest: Path, *, limit: int, stop_at: float = float("inf"),
             chunk_size: int = CHUNK) -> CopyResult:
    """Copy ``src`` to ``dest`` redacted; head + marker + tail when larger than ``limit``.

    The tail is copied first: it is what a hang leaves behind, and a copy that reaches
    ``stop_at`` (``time.monotonic()``) keeps it and loses (part of) the head instead, with a marker.
    Opened read-only and non-blocking (a FIFO swapped in for the file must not block us); stops at
    the size seen at open time, so a log still being written does not keep the copy going.
    """
    fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as fin:
        st = os.fstat(fin.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{src}: not a regular file")
        size = st.st_size
        tail_start = _next_line_start(fin, size - limit // 2)
        head_end = min(tail_start, size if size <= limit else _head_end(fin, limit // 2))
        tmp, tmp_tail = dest.with_name(f".{dest.name}.tmp"), dest.with_name(f".{dest.name}.tail")
        try:
            with open(tmp_tail, "w+b") as ftail, open(tmp, "wb") as fout:
                # A PEM block may have begun before the tail: the redactor finds out.
                tail, stopped = _copy_span(fin, ftail, tail_start, size,
                                           StreamRedactor(maybe_inside=tail_start > 0), stop_at,
                                           chunk_size)
                if stopped:
                    ftail.write(b"\n[ddp-autopsy: the copy ran out of time here; the rest of "
                                b"this file is missing]\n")
                head = 0
                if not stopped:
                    head, stopped = _copy_span(fin, fout, 0, head_end, StreamRedactor(), stop_at,
                                               chunk_size)
                if head < tail_start:
                    why = " (the copy ran out of time)" if stopped else ""
                    fout.write(f"[ddp-autopsy: {tail_start - head} bytes omitted from the middle "
                               f"of this file{why}]\n".encode())
                ftail.seek(0)
                shutil.copyfileobj(ftail, fout)
            os.replace(tmp, dest)
        finally:
            for leftover in (tmp, tmp_tail):
                leftover.unlink(missing_ok=True)
    copied = head + tail
    return CopyResult(size=size, copied=copied, truncated=copied < size, stopped_early=stopped)


def _copy_checked(access: Access, src: LogSource, dest: Path, *, limit: int,
                  stop_at: float) -> CopyResult:
    """Open ``src`` as the job's user may (:class:`Access`), then copy that very descriptor
    (through ``/proc/self/fd``, which reopens the same file); the copy is made owner-only."""
    held = src.read_from != src.source  # /proc/PID/fd/N of a deleted file
    fd = access.open_held(src.read_from) if held else access.open(src.read_from)
    try:
        result = copy_log(access.fd_path(fd), dest, limit=limit, stop_at=stop_at)
    finally:
        os.close(fd)
    os.chmod(dest, 0o600)
    return result


def copy_all(bundle: Bundle, plan: LogPlan, *, step_timeout: float,
             limit: int = MAX_LOG_BYTES) -> list[dict[str, object]]:
    """Copy every planned file as a ``file`` action; returns the manifest ``logs`` entries.
    A file the job's user may not read is refused (``plan.refused``, a ``permission_denied``
    action) and not copied.

    A copy stops itself at its budget and keeps what it has; the action's own timeout is one
    grace second longer, so only a copy stuck in the kernel (a dead NFS mount) is abandoned.
    """
    entries: list[dict[str, object]] = []
    for src in plan.sources.values():
        budget = bundle.budget(step_timeout)
        if budget is None:
            bundle.skipped("copy log", "file", src.source, src.dest)
            continue
        dest = bundle.path(src.dest)
        stop_at = bundle.stop_at(budget)
        outcome = bundle.probe(
            "copy log", lambda src=src, dest=dest, stop_at=stop_at: _copy_checked(
                plan.access, src, dest, limit=limit, stop_at=stop_at),
            target=src.source, step_timeout=budget, grace_s=COPY_GRACE_S, kind="file")
        action = outcome.action if outcome is not None else None
        if outcome is not None and action is not None and isinstance(outcome.error, Refused):
            action.status, action.error = PERMISSION_DENIED, f"refused: {reason(outcome.error)}"
            plan.refused.append(f"{src.source}: {reason(outcome.error)}")
        result = outcome.value if outcome and outcome.done and outcome.error is None else None
        if action is None or result is None:
            continue
        action.path = src.dest
        action.truncated = result.truncated
        if result.stopped_early and bundle.deadline.cancelled:
            action.status = SKIPPED
            action.error = "copy stopped: collect was interrupted (the tail is kept)"
        elif result.stopped_early:
            action.status, action.timeout_hit = "timeout", True
            action.error = "copy stopped at its time budget (the tail is kept)"
        entries.append({"source": src.source, "path": src.dest, "size": result.size,
                        "copied": result.copied, "truncated": result.truncated,
                        "kinds": src.kinds, "pids": src.pids})
    return entries
