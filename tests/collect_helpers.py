"""Helpers for the collect tests: start real hung jobs, wait for them (bounded), kill them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

JOBS_DIR = Path(__file__).parent / "collect_jobs"
HANG_SCRIPT = JOBS_DIR / "hang_allreduce.py"

# Planted secrets: none of these values may appear in any bundle file.
HF_TOKEN = "hf_" + "Zq7" * 12  # hf_ + 36 chars
SECRET_VALUE = "mysecretvalue-4711"
URL_PASSWORD = "s3cr3tpw0rd"
SECRET_URL = f"https://alice:{URL_PASSWORD}@data.example.com/shards"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
PLANTED = (HF_TOKEN, SECRET_VALUE, URL_PASSWORD, PEM_BODY)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (from ``/proc``), deepest last."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything below it (torchrun puts each worker in its own session,
    so a process-group kill is not enough)."""
    for target in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            os.kill(target, signal.SIGKILL)


@dataclass
class Job:
    proc: subprocess.Popen[bytes]
    root: Path
    ready_dir: Path
    log: Path
    port: int
    ranks: dict[int, int] = field(default_factory=dict)  # rank → pid, from the ready markers

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, n: int, timeout: float) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"job exited early ({self.proc.returncode}):\n"
                                   + self.log.read_text(errors="replace")[-4000:])
            # (a marker counts once its pid is in it: a rank may have created the file and not
            # yet written it)
            return len(self._markers()) >= n
        if not wait_for(ready, timeout):
            raise RuntimeError(f"job not ready after {timeout}s:\n"
                               + self.log.read_text(errors="replace")[-4000:])
        self.ranks.update(self._markers())

    def _markers(self) -> dict[int, int]:
        """rank → pid of the ready markers written so far."""
        out = {}
        for marker in self.ready_dir.iterdir():
            text = marker.read_text().strip()
            if marker.name.startswith("rank") and text.isdigit():
                out[int(marker.name.removeprefix("rank"))] = int(text)
        return out

    def stop(self) -> None:
        kill_tree(self.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def job_env(root: Path, ready_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC"))}
    env.update(READY_DIR=str(ready_dir), HF_TOKEN=HF_TOKEN, MY_SECRET_KEY=SECRET_VALUE,
               DATA_URL=SECRET_URL, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def start_torchrun(root: Path, nproc: int = 3, run_id: str | None = None,
                   **env_extra: str) -> Job:
    """``python -m torch.distributed.run`` of the hang script; rank 2 owns a 2-worker DataLoader.
    ``run_id`` becomes ``--rdzv-id`` (the workers' ``TORCHELASTIC_RUN_ID``; default ``none``)."""
    ready = root / "ready"
    ready.mkdir(parents=True)
    port = free_port()
    log = root / "agent.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--log-dir", str(root / "trlogs"), "--redirects", "3",
            *(["--rdzv-id", run_id] if run_id else []),
            str(HANG_SCRIPT), "--dataloader-rank", "2",
            "--data-url", SECRET_URL, "--hf-token", HF_TOKEN]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=root, env=job_env(root, ready, **env_extra),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Job(proc, root, ready, log, port)


def start_spawn(root: Path, nprocs: int = 2) -> Job:
    """``torch.multiprocessing.spawn`` of the hang script (children have no RANK env)."""
    ready = root / "ready"
    ready.mkdir(parents=True)
    port = free_port()
    log = root / "spawn.log"
    argv = [sys.executable, str(HANG_SCRIPT), "--spawn", str(nprocs)]
    env = job_env(root, ready, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Job(proc, root, ready, log, port)


def bundle_files(bundle: Path) -> list[Path]:
    return [p for p in bundle.rglob("*") if p.is_file()]


def main_thread(stack: list[dict[str, object]], pid: int) -> dict[str, object]:
    """The thread of a py-spy ``--json`` dump whose OS thread id is the process id."""
    return next(t for t in stack if t.get("os_thread_id") == pid)


def frame_names(thread: dict[str, object]) -> list[str]:
    return [str(f["name"]) for f in thread["frames"]]  # type: ignore[index, union-attr]
