"""Reading ``/proc``: one snapshot per process, never raising for a process that vanished.

Every reader returns ``None`` (or an empty value) when the process is gone or the file is
unreadable; :class:`ProcSnapshot` keeps *why* (``exited`` / ``permission_denied``) so the bundle can
tell "not there" from "not allowed".

Reads of ``cmdline``/``environ``/``maps`` take the target's mmap lock and can block on a process
stuck in the kernel (D state), so callers run them under a timeout (:func:`bundle.run_bounded`).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

_PYTHON_EXE = re.compile(r"^(?:python|pypy)[\d.]*[dmu]?$")


@dataclass(frozen=True)
class ProcSnapshot:
    """What discovery needs to know about one process."""

    pid: int
    ppid: int
    comm: str
    cmdline: tuple[str, ...]
    exe: str | None
    start_time: float | None  # seconds since the epoch
    environ: dict[str, str] | None  # None: unreadable (see environ_error)
    environ_error: str | None = None
    state: str = "?"  # /proc/PID/stat state: R, S, D, Z (zombie: exited, not yet reaped) …

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")

    @property
    def is_python(self) -> bool:
        return is_python(self.exe, self.cmdline)


def is_python(exe: str | None, cmdline: tuple[str, ...] | list[str]) -> bool:
    """A Python interpreter, judged by its executable (comm is renamed, e.g. ``pt_elastic``)."""
    names = []
    if exe:
        names.append(os.path.basename(exe.removesuffix(" (deleted)")))
    if cmdline:
        names.append(os.path.basename(cmdline[0]))
    return any(_PYTHON_EXE.match(n) for n in names)


def error_kind(exc: OSError) -> str:
    """``exited`` for a vanished process, ``permission_denied`` for EACCES/EPERM, else ``error``."""
    if exc.errno in (errno.ENOENT, errno.ESRCH):
        return "exited"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission_denied"
    return "error"


def list_pids() -> list[int]:
    return sorted(int(p) for p in os.listdir(PROC) if p.isdigit())


def exists(pid: int) -> bool:
    return (PROC / str(pid)).is_dir()


def read_stat(pid: int) -> tuple[int, str, int] | None:
    """``(ppid, comm, starttime_ticks)`` from ``/proc/PID/stat``; comm may hold spaces and ')'."""
    full = _read_stat(pid)
    return full[:3] if full else None


def read_state(pid: int) -> str | None:
    """The process state letter (``Z``: a zombie), None when gone."""
    full = _read_stat(pid)
    return full[3] if full else None


def _read_stat(pid: int) -> tuple[int, str, int, str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    comm = head.partition("(")[2]
    fields = rest.split()
    # fields[0] is the state (stat field 3); ppid is field 4, starttime field 22.
    try:
        return int(fields[1]), comm, int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


_BOOT_TIME: float | None = None


def boot_time() -> float:
    global _BOOT_TIME
    if _BOOT_TIME is None:
        _BOOT_TIME = 0.0
        try:
            for line in (PROC / "stat").read_text().splitlines():
                if line.startswith("btime "):
                    _BOOT_TIME = float(line.split()[1])
        except OSError:
            pass
    return _BOOT_TIME


def start_time(ticks: int) -> float:
    return boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def read_cmdline(pid: int, errors: str = "replace") -> tuple[str, ...] | None:
    """The arguments, decoded for display (``replace``) or, with ``errors="surrogateescape"``,
    so that ``os.fsencode`` gives back the exact bytes (paths in a Latin-1 command line)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return tuple(a.decode(errors=errors) for a in raw.split(b"\0") if a) if raw else ()


def read_environ(pid: int) -> tuple[dict[str, str] | None, str | None]:
    """The *initial* environment (later ``os.environ`` edits are invisible here), or the error."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError as exc:
        return None, error_kind(exc)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env, None


def readlink(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def read_exe(pid: int) -> str | None:
    return readlink(PROC / str(pid) / "exe")


def read_cwd(pid: int) -> str | None:
    return readlink(PROC / str(pid) / "cwd")


def fd_target(pid: int, fd: int) -> str | None:
    return readlink(PROC / str(pid) / "fd" / str(fd))


def fd_targets(pid: int) -> list[str]:
    """Targets of all open descriptors (``socket:[123]``, ``/dev/nvidia0``, paths …)."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    return [t for t in (readlink(fd_dir / n) for n in names) if t]


def read_maps_paths(pid: int) -> list[str]:
    """Distinct file paths mapped into the process (shared libraries, mostly)."""
    try:
        text = (PROC / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return []
    seen: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            seen.setdefault(parts[5], None)
    return list(seen)


def read_limits(pid: int) -> dict[str, dict[str, str]]:
    """``/proc/PID/limits`` as ``{"Max open files": {"soft": "1024", "hard": …, "units": …}}``."""
    try:
        lines = (PROC / str(pid) / "limits").read_text().splitlines()
    except OSError:
        return {}
    out: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        # Columns are fixed-width: name (26), soft (21), hard (21), units.
        name, soft, hard, units = line[:26].strip(), line[26:47].strip(), line[47:68].strip(), \
            line[68:].strip()
        if name:
            out[name] = {"soft": soft, "hard": hard, "units": units}
    return out


def snapshot(pid: int, *, python_env_only: bool = False) -> ProcSnapshot | None:
    """A :class:`ProcSnapshot`, or ``None`` when the process is gone. With ``python_env_only`` the
    environment of non-Python processes is not read (discovery only needs it for Python)."""
    stat = _read_stat(pid)
    if stat is None:
        return None
    ppid, comm, ticks, state = stat
    cmdline, exe = read_cmdline(pid) or (), read_exe(pid)
    env: dict[str, str] | None = None
    env_err: str | None = "not_read"
    if state in ("Z", "X"):  # exited, not yet reaped: nothing left to read
        env_err = "exited"
    elif not python_env_only or is_python(exe, cmdline):
        env, env_err = read_environ(pid)
    return ProcSnapshot(pid=pid, ppid=ppid, comm=comm, cmdline=cmdline, exe=exe,
                        start_time=start_time(ticks), environ=env, environ_error=env_err,
                        state=state)


def scan() -> dict[int, ProcSnapshot]:
    """Snapshot of every process on the host (environment read for Python processes only)."""
    snaps = {}
    for pid in list_pids():
        snap = snapshot(pid, python_env_only=True)
        if snap is not None:
            snaps[pid] = snap
    return snaps


def children_map(snapshots: dict[int, ProcSnapshot]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for snap in snapshots.values():
        children.setdefault(snap.ppid, []).append(snap.pid)
    for kids in children.values():
        kids.sort()
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from one ``/proc`` scan."""
    kids: dict[int, list[int]] = {}
    for other in list_pids():
        stat = read_stat(other)
        if stat is not None:
            kids.setdefault(stat[0], []).append(other)
    out, frontier = [], [pid]
    while frontier:
        frontier = [k for p in frontier for k in kids.get(p, [])]
        out += frontier
    return out
