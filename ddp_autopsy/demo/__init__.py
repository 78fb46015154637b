"""``ddp-autopsy demo``: reproduce a real hang on CPU, collect it, analyze it.

Launches :mod:`ddp_autopsy.demo.hung_job` under torchrun (3 ranks, Gloo), waits until every
rank is blocked, collects the job with the real collector (py-spy dumps of every rank), stops
the job, and analyzes the bundle: the verdict is printed and ``report.html`` written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ddp_autopsy.collectors import procs

NPROC = 3
READY_TIMEOUT_S = 120.0


class DemoError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(console: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = console.read_text(errors="replace") if console.exists() else ""
        ready = {line.split("rank=")[-1].strip() for line in text.splitlines()
                 if "DEMO_READY rank=" in line}
        if len(ready) >= NPROC:
            return
        if proc.poll() is not None:
            raise DemoError(f"the demo job exited early (code {proc.returncode}); see {console}")
        time.sleep(0.25)
    raise DemoError(f"the demo job did not reach its hang within {timeout:.0f} s; see {console}")


def stop_job(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop a launcher and everything below it. torchrun starts workers in their own sessions,
    so killing the launcher's group is not enough: SIGTERM lets the agent stop its workers,
    then whatever is left of the tree (recorded first) is SIGKILLed."""
    tree = procs.descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    for pid in [proc.pid, *tree]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def run_demo(out: Path, log=print) -> Path:
    """Run the whole demo into ``out``; return the bundle path."""
    try:
        import torch  # noqa: F401
    except ImportError as err:
        raise DemoError("the demo runs a real PyTorch job: install the torch extra, "
                        "pip install -c constraints.txt 'ddp-autopsy[torch]'") from err
    from ddp_autopsy.collectors import CollectOptions, collect
    from ddp_autopsy.collectors.jobs import CollectError

    bundle = out / "bundle"
    if bundle.exists() and (not bundle.is_dir() or any(bundle.iterdir())):
        raise DemoError(f"{out} already holds a demo run ({bundle} exists): analyze it with "
                        f"`ddp-autopsy analyze {bundle}`, or run the demo elsewhere with "
                        f"--out NEW_DIR (or delete {out})")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DemoError(f"cannot create {out}: {err.strerror or err}") from err
    console = out / "console.log"
    script = Path(__file__).with_name("hung_job.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={NPROC}",
           f"--master-port={_free_port()}", f"--log-dir={out / 'torchrun-logs'}",
           "--tee=3", str(script)]
    log(f"1/3 Starting a {NPROC}-rank torchrun job (Gloo on CPU) that will hang: "
        f"{' '.join(cmd[1:4])} ... hung_job.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with console.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        _wait_ready(console, proc, READY_TIMEOUT_S)
        log(f"2/3 The job is stuck. Collecting it as you would on a cluster node: "
            f"ddp-autopsy collect --pid {proc.pid}")
        try:
            result = collect(CollectOptions(pid=proc.pid, out=bundle, logs=[console],
                                            deadline_s=60, step_timeout_s=15))
        except CollectError as err:
            raise DemoError(f"collecting the demo job failed: {err}") from err
    finally:
        stop_job(proc)
    return result.bundle
