"""Blob storage behind one small interface: a local directory or an S3-compatible bucket.

Keys are server-made (``uploads/ab/<sha256>.tar.gz``, ``analyses/12.html``), never from a client.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

KEY_RE = re.compile(r"^[a-z]+(/[A-Za-z0-9_.-]+)+$")
CHUNK = 1 << 20


def _check(key: str) -> str:
    if not KEY_RE.match(key) or ".." in key.split("/"):
        raise ValueError(f"bad blob key {key!r}")
    return key


class Store(Protocol):
    def put_file(self, key: str, path: Path) -> None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def iter_bytes(self, key: str) -> Iterator[bytes]: ...
    def local_copy(self, key: str, dest: Path) -> Path:
        """A path on local disk holding the blob: the blob itself when local, or ``dest``."""
        ...
    def describe(self) -> str: ...


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / _check(key)

    def put_file(self, key: str, path: Path) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".{os.getpid()}.{threading.get_ident()}.part")
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)  # the upload's scratch file is on the same disk: no copy
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, dest)

    def put_bytes(self, key: str, data: bytes) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".{os.getpid()}.{threading.get_ident()}.part")
        tmp.write_bytes(data)
        os.replace(tmp, dest)

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        with self._path(key).open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def local_copy(self, key: str, dest: Path) -> Path:
        return self._path(key)

    def describe(self) -> str:
        return f"directory {self.root}"


class S3Store:
    def __init__(self, bucket: str, prefix: str, endpoint: str | None) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint)

    def _key(self, key: str) -> str:
        key = _check(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), self.bucket, self._key(key))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        yield from body.iter_chunks(CHUNK)

    def local_copy(self, key: str, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._key(key), str(dest))
        return dest

    def describe(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"


def open_store(url: str | None, data: Path, endpoint: str | None = None) -> Store:
    """``None`` or a path: a directory; ``s3://bucket/prefix``: S3 (endpoint from the option,
    ``DDP_AUTOPSY_S3_ENDPOINT`` or ``AWS_ENDPOINT_URL``)."""
    if not url:
        return LocalStore(data / "blobs")
    if url.startswith("s3://"):
        parsed = urlparse(url)
        if not parsed.netloc:
            raise ValueError(f"{url}: no bucket (s3://bucket/prefix)")
        endpoint = endpoint or os.environ.get("DDP_AUTOPSY_S3_ENDPOINT") \
            or os.environ.get("AWS_ENDPOINT_URL")
        return S3Store(parsed.netloc, parsed.path, endpoint)
    if "://" in url and not url.startswith("file://"):
        raise ValueError(f"{url}: unknown store (a directory or s3://bucket/prefix)")
    return LocalStore(Path(url.removeprefix("file://")))
