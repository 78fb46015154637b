"""Input discovery: turn the user's PATHs into readable sources, never extracting or modifying.

A PATH may be a log file (optionally ``.gz``/``.bz2``/``.xz``/``.zst``), a directory of logs, an
archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``) read in place, or a bundle written by
``ddp-autopsy collect`` (a directory or archive holding ``manifest.json``). Whatever cannot be read
becomes an :class:`InputNote` and the rest is analyzed.
"""

from __future__ import annotations

import bz2
import io
import lzma
import os
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

MAX_FILES = 100_000
BUNDLE_SCHEMA_PREFIX = "ddp-autopsy/bundle/"
SKIP_SUFFIXES = {".pyc", ".so", ".png", ".jpg", ".jpeg", ".gif", ".pt", ".pth", ".ckpt", ".bin",
                 ".safetensors", ".npy", ".npz", ".parquet", ".whl", ".pdf"}


@dataclass
class InputNote:
    """Something the user gave that could not be (fully) examined, and why."""

    path: str
    message: str
    level: str = "warning"

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "level": self.level, "message": self.message}


@dataclass
class Member:
    """One file inside a directory tree or archive."""

    display: str
    relpath: str
    size: int | None
    mtime: float | None
    opener: Callable[[], IO[bytes]]


@dataclass
class Tree:
    """A directory or an archive, listed without extraction."""

    display: str
    members: list[Member] = field(default_factory=list)

    def get(self, relpath: str) -> Member | None:
        relpath = relpath.lstrip("./")
        for m in self.members:
            if m.relpath == relpath:
                return m
        return None

    def read_bytes(self, relpath: str, limit: int = 256 << 20) -> bytes | None:
        m = self.get(relpath)
        if m is None:
            return None
        with m.opener() as fh:
            return fh.read(limit)


def _safe_member_name(name: str) -> str:
    """Archive member names are shown, never used as paths: make hostile ones harmless."""
    parts = [p for p in PurePosixPath(name.replace("\\", "/")).parts if p not in ("/", "..", ".")]
    return "/".join(parts) or "(unnamed)"


def _dir_tree(root: Path, notes: list[InputNote]) -> Tree:
    tree = Tree(display=str(root))
    seen_dirs: set[tuple[int, int]] = set()

    def walk_error(err: OSError) -> None:
        notes.append(InputNote(getattr(err, "filename", None) or str(root),
                               f"cannot read directory: {err.strerror or err}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error, followlinks=False):
        try:
            st = os.stat(dirpath)
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:
                dirnames[:] = []
                continue
            seen_dirs.add(key)
        except OSError:
            continue
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            try:
                st = full.stat()  # follows a symlinked file; a loop or dangling link raises
            except OSError as err:
                kind = "symlink loop or dangling link" if full.is_symlink() else "cannot stat"
                notes.append(InputNote(str(full), f"{kind}: {err.strerror or err}"))
                continue
            if not stat.S_ISREG(st.st_mode):
                notes.append(InputNote(str(full), "not a regular file, skipped", "info"))
                continue
            tree.members.append(
                Member(str(full), rel, st.st_size, st.st_mtime, lambda p=full: open(p, "rb"))
            )
            if len(tree.members) >= MAX_FILES:
                notes.append(InputNote(str(root), f"more than {MAX_FILES} files; the rest skipped"))
                return tree
    return tree


def _tar_tree(path: Path, notes: list[InputNote]) -> Tree | None:
    try:
        tf = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError, EOFError) as err:
        notes.append(InputNote(str(path), f"unreadable archive: {err}"))
        return None
    tree = Tree(display=str(path))
    try:
        for info in tf:
            if not info.isfile():
                continue
            name = _safe_member_name(info.name)
            if info.name.startswith("/") or ".." in PurePosixPath(info.name).parts:
                notes.append(InputNote(f"{path}!{info.name}",
                                       "member with an absolute or '..' path: read in place, "
                                       "never extracted", "info"))

            def opener(tf: tarfile.TarFile = tf, info: tarfile.TarInfo = info) -> IO[bytes]:
                fh = tf.extractfile(info)
                if fh is None:
                    raise OSError("not a regular member")
                return fh

            tree.members.append(Member(f"{path}!{name}", name, info.size, info.mtime, opener))
            if len(tree.members) >= MAX_FILES:
                break
    except (tarfile.TarError, OSError, EOFError) as err:
        notes.append(InputNote(str(path), f"archive is truncated or corrupt after "
                                          f"{len(tree.members)} members: {err}"))
    return tree


def _zip_tree(path: Path, notes: list[InputNote]) -> Tree | None:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        notes.append(InputNote(str(path), f"unreadable zip archive: {err}"))
        return None
    tree = Tree(display=str(path))
    for info in zf.infolist()[:MAX_FILES]:
        if info.is_dir():
            continue
        name = _safe_member_name(info.filename)
        tree.members.append(
            Member(f"{path}!{name}", name, info.file_size, None,
                   lambda zf=zf, info=info: zf.open(info))
        )
    return tree


ARCHIVE_RE = re.compile(r"\.(tar|tar\.gz|tgz|tar\.bz2|tbz2|tar\.xz|txz|tar\.zst|zip)$", re.I)


def open_tree(path: Path, notes: list[InputNote]) -> Tree | None:
    """List a directory or an archive; None (with a note) when it cannot be read."""
    if path.is_dir():
        return _dir_tree(path, notes)
    if path.suffix.lower() == ".zip":
        return _zip_tree(path, notes)
    return _tar_tree(path, notes)


def is_archive(path: Path) -> bool:
    if ARCHIVE_RE.search(path.name):
        return True
    try:
        return path.is_file() and tarfile.is_tarfile(path)
    except OSError:
        return False


class TolerantGzip(io.RawIOBase):
    """A gzip reader that hands out everything up to the point where a truncated or corrupt
    stream stops, and only then raises (``gzip.GzipFile.read`` loses the partial block)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buf = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while not self._eof and (size < 0 or len(self._buf) < size):
            piece = self._raw.read(1 << 20)
            if not piece:
                self._eof = True
                if not self._d.eof and self._buf == b"":
                    raise EOFError("compressed file ended before the end-of-stream marker")
                if not self._d.eof:
                    self._pending_error = True
                break
            try:
                self._buf += self._d.decompress(piece)
            except zlib.error as err:
                self._eof = True
                if not self._buf:
                    raise OSError(f"corrupt gzip data: {err}") from err
                self._pending_error = True
                break
            while self._d.eof and self._d.unused_data:  # concatenated gzip members
                rest = self._d.unused_data
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._buf += self._d.decompress(rest)
        if size < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:size], self._buf[size:]
        if not out and getattr(self, "_pending_error", False):
            self._pending_error = False
            raise EOFError("compressed file ended before the end-of-stream marker")
        return out

    def close(self) -> None:
        self._raw.close()
        super().close()


def decompressed(member: Member) -> IO[bytes]:
    """Open a member, decompressing by suffix (``.gz``, ``.bz2``, ``.xz``, ``.zst``)."""
    raw = member.opener()
    name = member.relpath.lower()
    if name.endswith(".gz"):
        return TolerantGzip(raw)  # type: ignore[return-value]
    if name.endswith(".bz2"):
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if name.endswith(".xz"):
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as err:
            raw.close()
            raise OSError("zstd-compressed: install the 'zstandard' package to read it") from err
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))  # type: ignore[arg-type]
    return raw


def iter_inputs(paths: list[Path], notes: list[InputNote]) -> Iterator[tuple[Path, Tree]]:
    """Yield a tree per PATH (a single file becomes a one-member tree)."""
    for path in paths:
        if not path.exists() and not path.is_symlink():
            notes.append(InputNote(str(path), "does not exist", "error"))
            continue
        try:
            if path.is_dir() or is_archive(path):
                tree = open_tree(path, notes)
            else:
                st = path.stat()
                tree = Tree(display=str(path), members=[
                    Member(str(path), path.name, st.st_size, st.st_mtime,
                           lambda p=path: open(p, "rb"))
                ])
        except OSError as err:
            notes.append(InputNote(str(path), f"cannot read: {err.strerror or err}", "error"))
            continue
        if tree is not None:
            yield path, tree
