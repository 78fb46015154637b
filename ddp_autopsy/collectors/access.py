"""Reading only what the job's own user may read.

collect often runs as root (an admin on a hung node) while the job belongs to someone else, and
the job's command line and environment name the paths collect reads (``--log-dir``, Flight
Recorder prefixes, ``file://`` init files). So that a job cannot make a privileged collect copy
``/root`` or ``/etc`` into a shareable bundle, every path is opened by :class:`Access`:

* when collect runs as the job's user, a plain open (the kernel checks it);
* otherwise the path is resolved one component at a time from ``/`` (``openat`` with
  ``O_NOFOLLOW``; symbolic links are read and resolved by hand, at most 40), each directory's
  search bit and the final file's read (or write) bit checked with the job owner's uid and
  groups on the ``fstat`` of the very descriptor that was opened, so a path swapped for a
  symbolic link after the check cannot lead anywhere the job's user could not go.

The check reads the mode bits only (an ACL granting more is not honoured: that file is refused),
and a job running as root may read everything. A refusal raises :class:`Refused`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_SYMLINKS = 40  # as the kernel (ELOOP)
_R, _W, _X = 4, 2, 1
_KINDS = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "fifo": stat.S_ISFIFO}


class Refused(PermissionError):
    """The job's user may not read (or reach) this path: not copied."""


@dataclass(frozen=True)
class Creds:
    """The filesystem identity of a process: fsuid, and fsgid plus supplementary groups."""

    uid: int
    gids: frozenset[int]

    def allows(self, st: os.stat_result, bits: int) -> bool:
        """Mode-bit permission check as the kernel does it (owner, else group, else other)."""
        if self.uid == 0:  # root reads anything and searches any directory
            return not (bits & _X) or stat.S_ISDIR(st.st_mode) or bool(st.st_mode & 0o111)
        if st.st_uid == self.uid:
            have = (st.st_mode >> 6) & 7
        elif st.st_gid in self.gids:
            have = (st.st_mode >> 3) & 7
        else:
            have = st.st_mode & 7
        return have & bits == bits

    def __str__(self) -> str:
        return f"uid {self.uid}"


def read_creds(pid: int) -> Creds | None:
    """The fsuid / fsgid / groups of ``pid`` from ``/proc/PID/status``; None when gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups", "State"):
            fields[key] = value.split()
    try:
        uid, gid = int(fields["Uid"][3]), int(fields["Gid"][3])  # real, effective, saved, fs
        groups = frozenset(int(g) for g in fields.get("Groups", []))
    except (KeyError, IndexError, ValueError):
        return None
    return Creds(uid, groups | {gid})


def job_access(pids: Iterable[int]) -> Access:
    """The :class:`Access` for a job made of ``pids``: checked with every distinct user among
    them (a path must pass for each), plain when collect runs as that one user."""
    creds = {c for c in (read_creds(pid) for pid in pids) if c is not None}
    uid = os.geteuid()
    if creds and all(c.uid == uid for c in creds):
        return Access(None)
    return Access(tuple(sorted(creds, key=lambda c: (c.uid, sorted(c.gids)))))


class Access:
    """Opens paths on behalf of the job's user(s); ``creds=None`` means collect *is* that user.
    An empty tuple (the job's user is unknown) refuses everything."""

    def __init__(self, creds: tuple[Creds, ...] | None) -> None:
        self.creds = creds

    @property
    def checked(self) -> bool:
        return self.creds is not None

    def describe(self) -> str:
        if self.creds is None:
            return "as the job's user"
        return "checked for " + (", ".join(map(str, self.creds)) or "an unknown user")

    # -- public --------------------------------------------------------------------------------
    def open(self, path: str | os.PathLike[str], kind: str = "file") -> int:
        """A descriptor for ``path`` (``kind``: ``file`` and ``dir`` read, ``fifo`` write,
        non-blocking). Raises :class:`Refused`, or OSError when it does not exist."""
        path = os.fspath(path)
        flags = _flags(kind)
        if self.creds is None:
            st = os.stat(path)  # never open a device or FIFO by mistake: check the type first
            if not _KINDS[kind](st.st_mode):
                raise _wrong_kind(path, kind)
            fd = os.open(path, flags)
            return _verify(fd, path, kind, None)
        return self._walk(path, kind, flags)

    def open_held(self, proc_fd_path: str) -> int:
        """A file a process holds open (``/proc/PID/fd/N``, maybe deleted): the job's user must
        be able to read the inode itself (the path it had is gone)."""
        fd = os.open(proc_fd_path, _flags("file"))
        return _verify(fd, proc_fd_path, "file", self.creds)

    def listdir(self, path: str | os.PathLike[str]) -> list[str]:
        """Names in a directory the job's user may list (``os.fsdecode`` names)."""
        fd = self.open(path, "dir")
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def fd_path(self, fd: int) -> str:
        """A path that reopens exactly ``fd`` (for readers that take a path)."""
        return f"/proc/self/fd/{fd}"

    # -- the component walk --------------------------------------------------------------------
    def _walk(self, path: str, kind: str, flags: int) -> int:
        assert self.creds is not None
        if not self.creds:
            raise Refused(errno.EACCES, "the job's user is unknown: nothing is read for it", path)
        if not os.path.isabs(path):
            raise Refused(errno.EACCES, "not an absolute path", path)
        todo = [p for p in path.split("/") if p and p != "."][::-1]  # a stack, next part last
        cur = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        links = 0
        try:
            while True:
                self._require(cur, _X, path, "a directory on the way is not searchable")
                if not todo:  # the path was "/"
                    raise _wrong_kind(path, kind)
                name = todo.pop()
                st = os.stat(name, dir_fd=cur, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise OSError(errno.ELOOP, "too many symbolic links", path)
                    target = os.readlink(name, dir_fd=cur)
                    todo.extend([p for p in target.split("/") if p and p != "."][::-1])
                    if target.startswith("/"):
                        os.close(cur)
                        cur = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    continue
                if todo:  # a directory to pass through ('..' included)
                    if not stat.S_ISDIR(st.st_mode):
                        raise OSError(errno.ENOTDIR, "not a directory", path)
                    nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  dir_fd=cur)
                    os.close(cur)
                    cur = nxt
                    continue
                if not _KINDS[kind](st.st_mode):
                    raise _wrong_kind(path, kind)
                fd = os.open(name, flags | os.O_NOFOLLOW, dir_fd=cur)
                return _verify(fd, path, kind, self.creds)
        finally:
            os.close(cur)

    def _require(self, fd: int, bits: int, path: str, why: str) -> None:
        st = os.fstat(fd)
        for c in self.creds or ():
            if not c.allows(st, bits):
                raise Refused(errno.EACCES, f"{why} for {c}", path)


def _flags(kind: str) -> int:
    base = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if kind == "fifo":
        return base | os.O_WRONLY
    return base | os.O_RDONLY | (os.O_DIRECTORY if kind == "dir" else 0)


def _wrong_kind(path: str, kind: str) -> OSError:
    what = {"file": "a regular file", "dir": "a directory", "fifo": "a FIFO"}[kind]
    return OSError(errno.EINVAL, f"not {what}", path)


def _verify(fd: int, path: str, kind: str, creds: tuple[Creds, ...] | None) -> int:
    """Check the opened descriptor itself: its type and, for a job's user, its mode."""
    try:
        st = os.fstat(fd)
        if not _KINDS[kind](st.st_mode):
            raise _wrong_kind(path, kind)
        bits = _W if kind == "fifo" else _R | (_X if kind == "dir" else 0)
        for c in creds or ():
            if not c.allows(st, bits):
                raise Refused(errno.EACCES, f"not {'writable' if bits == _W else 'readable'} "
                              f"by {c} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid "
                              f"{st.st_uid})", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def reason(exc: OSError) -> str:
    """``exc`` as the short text a manifest note keeps."""
    return exc.strerror or str(exc)
