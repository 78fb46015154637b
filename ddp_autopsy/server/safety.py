"""Inspect an upload before it is kept: what it is, and whether it is safe to keep.

Nothing is extracted. Archives are read as streams with every byte counted, so a zip bomb
stops at the expansion limit, and member names that would escape an extraction directory
(absolute, ``..``, links pointing out, devices) refuse the whole upload. The analyzer reads
the archive in place later (``analyzer/sources.py``), with its own bounds.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ddp_autopsy.analyzer.sources import READ_ERRORS, compression_of, open_compressed
from ddp_autopsy.server.config import Limits

CHUNK = 1 << 20
MANIFEST_MAX = 4 << 20
BUNDLE_SCHEMA_PREFIX = "ddp-autopsy/bundle/"


class Rejected(Exception):
    """An upload the server will not keep: an HTTP status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class UploadInfo:
    kind: str  # tar, tar.gz, ..., zip, log, log.gz, ...
    files: int
    expanded: int
    #: From a bundle's manifest.json: the job it belongs to and the node that collected it.
    job_key: str | None = None
    host: str | None = None
    job_name: str | None = None


class _Counted(io.RawIOBase):
    """A reader that refuses to yield more than ``limit`` bytes in total."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.raw.read(len(b))
        self.count += len(data)
        if self.count > self.limit:
            raise Rejected(413, f"upload expands beyond the limit of {self.limit} bytes "
                                "(a compression bomb?)")
        b[:len(data)] = data
        return len(data)


def _escapes(name: str) -> bool:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return True
    norm = posixpath.normpath(name)
    return norm == ".." or norm.startswith("../")


def _job_of(manifest: Any) -> tuple[str | None, str | None, str | None]:
    """(join key, host, job name) from a bundle manifest: run_id when set, else key."""
    if not isinstance(manifest, dict) or not str(manifest.get("schema", "")).startswith(
            BUNDLE_SCHEMA_PREFIX):
        return None, None, None
    job = manifest.get("job") if isinstance(manifest.get("job"), dict) else {}
    run_id = job.get("run_id")
    key = f"run:{run_id}" if run_id not in (None, "", "none") else \
        (f"key:{job['key']}" if job.get("key") else None)
    name = None
    cmd = job.get("cmdline") if isinstance(job.get("cmdline"), list) else []
    scripts = [str(a) for a in cmd if str(a).endswith(".py")]
    if scripts:
        name = posixpath.basename(scripts[-1])
    elif job.get("key"):
        name = str(job["key"])
    host = manifest.get("host")
    return (key[:300] if key else None, str(host)[:300] if host else None,
            name[:300] if name else None)


def _read_manifest(f: IO[bytes], info: UploadInfo) -> None:
    data = f.read(MANIFEST_MAX + 1)
    if len(data) > MANIFEST_MAX:
        return
    try:
        manifest = json.loads(data)
    except ValueError:
        return
    key, host, name = _job_of(manifest)
    if key or host:
        info.job_key, info.host, info.job_name = key, host, name


def _is_manifest(name: str) -> bool:
    parts = posixpath.normpath(name).split("/")
    return parts[-1] == "manifest.json" and len(parts) <= 2


def inspect(path: Path, limits: Limits) -> UploadInfo:
    """Classify and check the uploaded file; raise :class:`Rejected` when it is not kept."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
        if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
            return _inspect_zip(path, limits)
        comp = compression_of(head)
        with path.open("rb") as raw:
            stream = open_compressed(raw, comp) if comp else raw
            counted = _Counted(stream, limits.expanded_bytes)
            reader = io.BufferedReader(counted, CHUNK)
            block = reader.peek(512)[:512]
            is_tar = len(block) >= 262 and block[257:262] == b"ustar"
            suffix = f".{comp}" if comp else ""
            if is_tar:
                return _inspect_tar(reader, counted, "tar" + suffix, limits)
            while reader.read(CHUNK):
                pass
            return UploadInfo(kind="log" + suffix, files=1, expanded=counted.count)
    except Rejected:
        raise
    except READ_ERRORS as err:
        raise Rejected(422, f"the upload could not be read: {err}") from err


def _inspect_tar(reader: IO[bytes], counted: _Counted, kind: str, limits: Limits) -> UploadInfo:
    info = UploadInfo(kind=kind, files=0, expanded=0)
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for member in tar:
            if _escapes(member.name):
                raise Rejected(400, f"archive member {member.name!r} would escape the archive "
                                    "(absolute path or '..')")
            if member.issym() or member.islnk():
                target = member.linkname
                joined = posixpath.join(posixpath.dirname(member.name), target) \
                    if member.issym() else target
                if _escapes(target if target.startswith("/") else joined):
                    raise Rejected(400, f"archive member {member.name!r} links outside the "
                                        f"archive ({target!r})")
            elif not (member.isfile() or member.isdir()):
                raise Rejected(400, f"archive member {member.name!r} is a device, FIFO or "
                                    "other special file")
            if member.isfile():
                info.files += 1
                if info.files > limits.files:
                    raise Rejected(413, f"archive holds more than {limits.files} files")
                if _is_manifest(member.name) and info.job_key is None:
                    f = tar.extractfile(member)
                    if f is not None:
                        _read_manifest(f, info)
    while reader.read(CHUNK):  # trailing padding: count every byte
        pass
    info.expanded = counted.count
    return info


def _inspect_zip(path: Path, limits: Limits) -> UploadInfo:
    info = UploadInfo(kind="zip", files=0, expanded=0)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as err:
        raise Rejected(422, f"the upload is not a readable zip archive: {err}") from err
    with zf:
        members = zf.infolist()
        if len(members) > limits.files:
            raise Rejected(413, f"archive holds more than {limits.files} files")
        declared = 0
        for m in members:
            if _escapes(m.filename):
                raise Rejected(400, f"archive member {m.filename!r} would escape the archive "
                                    "(absolute path or '..')")
            declared += m.file_size
        if declared > limits.expanded_bytes:
            raise Rejected(413, f"upload expands to {declared} bytes, beyond the limit of "
                                f"{limits.expanded_bytes} bytes (a compression bomb?)")
        total = 0
        for m in members:  # sizes can lie: decompress and count
            if m.is_dir():
                continue
            info.files += 1
            with zf.open(m) as f:
                counted = _Counted(f, limits.expanded_bytes - total)
                if _is_manifest(m.filename) and info.job_key is None:
                    _read_manifest(io.BufferedReader(counted, CHUNK), info)
                while counted.read(CHUNK):
                    pass
                total += counted.count
        info.expanded = total
    return info
