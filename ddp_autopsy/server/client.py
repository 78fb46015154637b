"""Upload bundles, archives and logs to a ddp-autopsy server (``ddp-autopsy upload``).

A directory is sent as a gzip'd tar made on the fly (streamed, never written to disk) and made
deterministically (sorted, owner and gzip timestamp zeroed), so uploading the same bundle twice
sends the same bytes and the server keeps one incident. Files are streamed as they are.
"""

from __future__ import annotations

import gzip
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


class UploadError(Exception):
    """The server refused the upload or could not be reached; the message says why."""


def _tar_members(root: Path) -> Iterator[tuple[Path, str]]:
    """(path, archive name) of the directory's regular files and dirs, sorted, no symlinks."""
    base = root.name or "bundle"
    yield root, base
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        here = Path(dirpath)
        for name in dirnames:
            p = here / name
            if not p.is_symlink():
                yield p, f"{base}/{p.relative_to(root).as_posix()}"
        for name in sorted(filenames):
            p = here / name
            st = p.lstat()
            if stat.S_ISREG(st.st_mode):
                yield p, f"{base}/{p.relative_to(root).as_posix()}"


def _write_tar(root: Path, out: IO[bytes]) -> None:
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6, filename="") as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, name in _tar_members(root):
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def tar_stream(root: Path) -> Iterator[bytes]:
    """The directory as a .tar.gz, produced by a thread into a pipe and yielded in chunks."""
    rfd, wfd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(wfd, "wb") as w:
                _write_tar(root, w)
        except BaseException as err:  # reported by the consumer
            failure.append(err)

    th = threading.Thread(target=produce, daemon=True)
    th.start()
    with os.fdopen(rfd, "rb") as r:
        while chunk := r.read(CHUNK):
            yield chunk
    th.join()
    if failure:
        raise UploadError(f"{root}: could not read the directory: {failure[0]}")


def _file_stream(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def upload(path: Path | str, url: str, token: str | None, *, timeout: float = 600.0
           ) -> dict[str, Any]:
    """Upload one PATH; returns the server's answer (incident id, permalink, duplicate)."""
    import httpx

    path = Path(path)
    if path.is_dir():
        name = f"{path.resolve().name or 'bundle'}.tar.gz"
        body: Iterator[bytes] = tar_stream(path)
    elif path.is_file():
        name = path.name
        body = _file_stream(path)
    else:
        raise UploadError(f"{path}: no such file or directory")
    headers = {"Content-Type": "application/octet-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    base = url.rstrip("/")
    try:
        resp = httpx.post(f"{base}/api/v1/uploads", params={"name": name}, content=body,
                          headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        raise UploadError(f"{path}: could not upload to {base}: {err}") from err
    try:
        answer = resp.json()
    except ValueError:
        answer = {}
    if resp.status_code >= 400:
        message = (answer.get("error") or {}).get("message") if isinstance(answer, dict) \
            else None
        raise UploadError(f"{path}: the server refused the upload ({resp.status_code}): "
                          f"{message or resp.text[:300]}")
    answer["url"] = base + answer.get("permalink", "")
    return answer
