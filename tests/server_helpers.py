"""Real processes for the server tests: ``ddp-autopsy serve`` (uvicorn), a throwaway
PostgreSQL cluster (Debian's binaries, ``initdb``/``pg_ctl``) and moto's S3 server.

Each starts on a free loopback port, is waited for until it answers, and is stopped (or
killed, to test recovery) by its own pid.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN = "test-token-0123456789"  # the project "default"
#: A second project's token: it must never see the first's incidents unless shared.
TOKEN_B = "beta-token-9876543210"
PROJECT_B = "beta"
PG_BIN_DIRS = ["/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin",
               "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/14/bin"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 60.0,
              what: str = "server", log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{text}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout} s")


class Server:
    """``ddp-autopsy serve`` in a subprocess."""

    def __init__(self, data: Path, *, db: str | None = None, store: str | None = None,
                 env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.data = data
        self.db = db
        self.store = store
        self.env = {**os.environ, **(env or {})}
        self.args = args or []
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data.parent / f"{data.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra: str, env: dict[str, str] | None = None) -> Server:
        self.port = free_port()
        cmd = [sys.executable, "-m", "ddp_autopsy", "serve", "--data", str(self.data),
               "--port", str(self.port), "--token", TOKEN, "--token", f"{PROJECT_B}:{TOKEN_B}",
               "--log-level", "warning",
               *self.args, *extra]
        if self.db:
            cmd += ["--db", self.db]
        if self.store:
            cmd += ["--store", self.store]
        out = self.log.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     env={**self.env, **(env or {})})
        out.close()
        wait_http(f"{self.url}/healthz", self.proc, what="ddp-autopsy serve", log=self.log)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup (a crashed or OOM-killed server)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, headers=auth(token))

    def get(self, path: str, token: str | None = TOKEN, **kw: Any) -> httpx.Response:
        """GET a path of this server as the token's project (None: anonymously)."""
        return httpx.get(self.url + path, headers=auth(token), timeout=60, **kw)

    def upload(self, body: bytes | Path, name: str, token: str | None = TOKEN) -> httpx.Response:
        data = body.read_bytes() if isinstance(body, Path) else body
        return httpx.post(f"{self.url}/api/v1/uploads", params={"name": name}, content=data,
                          headers=auth(token), timeout=120)

    def wait_analysed(self, incident: str, timeout: float = 90.0, token: str = TOKEN
                      ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            last = httpx.get(f"{self.url}/api/v1/incidents/{incident}", timeout=10,
                             headers=auth(token)).json()
            if last.get("status") in ("done", "error") and not last.get("pending"):
                return last
            time.sleep(0.2)
        raise AssertionError(f"incident {incident} not analysed in {timeout} s: {last}\n"
                             + self.log.read_text(errors="replace")[-3000:])


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def pg_bin() -> Path | None:
    for d in PG_BIN_DIRS:
        if (Path(d) / "initdb").is_file() and (Path(d) / "pg_ctl").is_file():
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found and shutil.which("pg_ctl") else None


class Postgres:
    """A PostgreSQL cluster in a temporary directory, run as a non-root user when root."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="ddpa-pg-"))
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres" if _user_exists("postgres") else "nobody"
            shutil.chown(self.dir, self.user)
            self.dir.chmod(0o700)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> Postgres:
        assert self.bin is not None
        data = self.dir / "data"
        r = self._run(self.bin / "initdb", "-D", data, "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--no-sync")
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stderr}")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        r = self._run(self.bin / "pg_ctl", "-D", data, "-o", opts, "-l", self.dir / "log",
                      "-w", "-t", "60", "start")
        if r.returncode:
            log = (self.dir / "log").read_text(errors="replace") if (self.dir / "log").exists() \
                else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr}\n{log}")
        return self

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.bin is not None and (self.dir / "data" / "postmaster.pid").exists():
            self._run(self.bin / "pg_ctl", "-D", self.dir / "data", "-m", "immediate", "-w",
                      "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


class Moto:
    """moto's S3-compatible server on loopback."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "moto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Moto:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **S3_ENV})
        out.close()
        wait_http(f"{self.url}/moto-api/", self.proc, what="moto server", log=self.log)
        return self

    def bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.url, **_boto_keys()).create_bucket(Bucket=name)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _boto_keys() -> dict[str, str]:
    return {"aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
            "region_name": S3_ENV["AWS_DEFAULT_REGION"]}


# --- hostile archives ----------------------------------------------------------------------


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def traversal_tar() -> bytes:
    body = b"owned\n"
    return tar_bytes([(file_info("logs/rank0.log", 4), b"ok\n\n"),
                      (file_info("../../escaped-by-ddpa-test.txt", len(body)), body)])


def symlink_tar() -> bytes:
    link = tarfile.TarInfo("logs/passwd")
    link.type = tarfile.SYMTYPE
    link.linkname = "../../../../etc/passwd"
    return tar_bytes([(link, None)])


class _Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def gzip_bomb_tar(expanded: int) -> bytes:
    """A .tar.gz holding one file of ``expanded`` zero bytes (~1000x compression)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.addfile(file_info("logs/zeros.log", expanded), io.BufferedReader(_Zeros(expanded)))
    return buf.getvalue()


def zip_bomb(expanded: int) -> bytes:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf, \
            zf.open("zeros.log", "w", force_zip64=True) as f:
        chunk = bytes(1 << 20)
        for _ in range(expanded >> 20):
            f.write(chunk)
    return buf.getvalue()
