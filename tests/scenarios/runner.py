"""Run the scenario library: real failing PyTorch distributed jobs (Gloo on CPU).

Each ``tests/scenarios/<name>.py`` is a job program (runnable as a script) that declares,
at module level and as plain literals, how to launch it and what it should demonstrate::

    LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "hang": False, "timeout_s": 60}
    EXPECT = {"cause": "rank_crashed", "ranks": [2], "notes": "..."}
    SETUP = "occupy_master_port"          # optional: a runner-side fixture, see SETUPS

The runner reads those with :mod:`ast` (it never imports the program, so never imports torch),
launches the job exactly as a user would (``python -m torch.distributed.run ...`` or
``python program.py`` for programs that call ``torch.multiprocessing.spawn`` themselves) and
captures the launcher's combined stdout+stderr to ``console.log``, as a terminal or a SLURM
``.out`` file would. Hang scenarios are collected with :func:`ddp_autopsy.collectors.collect`
once every rank has printed ``SCENARIO_READY rank=N``, then the job is terminated.

LAUNCH keys (all optional except ``launcher``):

``launcher``     ``"torchrun"`` or ``"python"`` (the program launches its own processes).
``nproc``        torchrun ``--nproc-per-node``.
``args``         extra program arguments.
``env``          extra environment for the job.
``master_addr``  torchrun ``--master-addr`` / ``MASTER_ADDR`` (default ``127.0.0.1``).
``log_dir``      pass ``--log-dir <run>/torchrun_logs``.
``tee``          pass ``--tee 3`` (console lines prefixed ``[default<local_rank>]:``).
``redirects``    pass ``--redirects 3`` (worker output only in the log dir).
``torchrun_args`` more torchrun options, e.g. ``["--rdzv-conf", "timeout=5"]``.
``attempts``     launch the job this many times, appending to the same console.log.
``hang``         the job hangs: wait for ``ready`` markers, collect, then terminate it.
``ready``        number of ``SCENARIO_READY`` markers to wait for (hang scenarios).
``timeout_s``    hard bound on each attempt (and on the wait for ready markers).
"""

from __future__ import annotations

import ast
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCENARIO_DIR = Path(__file__).resolve().parent
READY_RE = re.compile(r"SCENARIO_READY rank=(\d+)")
TAG_ENV = "DDP_AUTOPSY_SCENARIO_TAG"
NOT_SCENARIOS = {"runner", "__init__", "conftest"}
# Variables a developer's shell might carry that would change how the job behaves.
SCRUBBED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_CPP_LOG_LEVEL",
    "NCCL_DEBUG",
    "OMP_NUM_THREADS",
)
# Pick master ports below the kernel's ephemeral range (32768+), where Gloo's own
# listening sockets and outgoing connections land, so parallel scenarios don't collide.
PORT_RANGE = (20000, 32000)
_ports_lock = threading.Lock()
_ports_used: set[int] = set()


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    path: Path
    launch: dict[str, Any]
    expect: dict[str, Any]
    setup: str | None = None
    doc: str = ""

    @property
    def hang(self) -> bool:
        return bool(self.launch.get("hang", False))

    @property
    def timeout_s(self) -> float:
        return float(self.launch.get("timeout_s", 60))


@dataclass
class ScenarioRun:
    name: str
    dir: Path
    console: Path
    returncode: int | None  # None: the runner had to stop the job (hang scenarios, timeouts)
    bundle: Path | None
    log_dir: Path | None
    duration_s: float
    expect: dict[str, Any]
    returncodes: list[int | None] = field(default_factory=list)  # one per attempt
    master_port: int = 0
    ready_s: float | None = None  # hang scenarios: seconds until every rank was ready
    collect_s: float | None = None  # hang scenarios: seconds spent in collect()
    error: str | None = None  # runner-side problem (markers never seen, collector failed, ...)

    def console_text(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    def rank_logs(self) -> dict[int, dict[str, Path]]:
        """torchrun ``--log-dir`` files: {local_rank: {"stdout": path, "stderr": path}}."""
        out: dict[int, dict[str, Path]] = {}
        if self.log_dir is None or not self.log_dir.is_dir():
            return out
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            out.setdefault(int(path.parent.name), {})[path.stem] = path
        return out


@dataclass
class RunContext:
    spec: ScenarioSpec
    dir: Path
    master_addr: str
    master_port: int


# --------------------------------------------------------------------------- discovery


def load_spec(path: Path) -> ScenarioSpec | None:
    """Read LAUNCH / EXPECT / SETUP literals from a scenario program without importing it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in {"LAUNCH", "EXPECT", "SETUP"}:
                found[target.id] = ast.literal_eval(node.value)
    if "LAUNCH" not in found:
        return None
    launch = found["LAUNCH"]
    if launch.get("launcher") not in {"torchrun", "python"}:
        raise ValueError(f"{path.name}: LAUNCH['launcher'] must be 'torchrun' or 'python'")
    setup = found.get("SETUP")
    if setup is not None and setup not in SETUPS:
        raise ValueError(f"{path.name}: unknown SETUP {setup!r}; known: {sorted(SETUPS)}")
    return ScenarioSpec(
        name=path.stem,
        path=path,
        launch=launch,
        expect=found.get("EXPECT", {}),
        setup=setup,
        doc=ast.get_docstring(tree) or "",
    )


def discover(directory: Path = SCENARIO_DIR) -> dict[str, ScenarioSpec]:
    specs: dict[str, ScenarioSpec] = {}
    for path in sorted(directory.glob("*.py")):
        if path.stem in NOT_SCENARIOS or path.stem.startswith("_"):
            continue
        spec = load_spec(path)
        if spec is not None:
            specs[spec.name] = spec
    return specs


# --------------------------------------------------------------------------- setups


def free_port() -> int:
    """A TCP port nobody listens on, not handed out before in this process."""
    with _ports_lock:
        for _ in range(200):
            port = random.randrange(*PORT_RANGE)
            if port in _ports_used:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("", port))
                except OSError:
                    continue
            _ports_used.add(port)
            return port
    raise RuntimeError("no free TCP port found")


@contextlib.contextmanager
def _hold_port(port: int) -> Iterator[None]:
    """Listen on ``port`` like a stale job that still owns it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", port))
        sock.listen()
        yield


def occupy_master_port(ctx: RunContext, attempt: int) -> contextlib.AbstractContextManager[None]:
    """Another process holds the master port for the whole run."""
    return _hold_port(ctx.master_port)


def occupy_master_port_first_attempt(
    ctx: RunContext, attempt: int
) -> contextlib.AbstractContextManager[None]:
    """The master port is held during the first attempt only, then freed (stale job died)."""
    return _hold_port(ctx.master_port) if attempt == 0 else contextlib.nullcontext()


# A setup is entered around each attempt: fn(ctx, attempt) -> context manager.
SETUPS: dict[str, Callable[[RunContext, int], contextlib.AbstractContextManager[None]]] = {
    "occupy_master_port": occupy_master_port,
    "occupy_master_port_first_attempt": occupy_master_port_first_attempt,
}

SCENARIOS: dict[str, ScenarioSpec] = discover()


# --------------------------------------------------------------------------- launching


def build_command(ctx: RunContext, log_dir: Path | None) -> list[str]:
    launch, spec = ctx.spec.launch, ctx.spec
    program = [str(spec.path), *map(str, launch.get("args", []))]
    if launch["launcher"] == "python":
        return [sys.executable, *program]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(launch.get("nproc", 2)),
        "--master-addr",
        ctx.master_addr,
        "--master-port",
        str(ctx.master_port),
    ]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir)]
    if launch.get("tee"):
        cmd += ["--tee", "3"]
    if launch.get("redirects"):
        cmd += ["--redirects", "3"]
    return cmd + [str(a) for a in launch.get("torchrun_args", [])] + program


def build_env(ctx: RunContext, tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    if ctx.spec.launch["launcher"] == "python":
        env["MASTER_ADDR"] = ctx.master_addr
        env["MASTER_PORT"] = str(ctx.master_port)
    env.update({k: str(v) for k, v in ctx.spec.launch.get("env", {}).items()})
    env[TAG_ENV] = tag
    return env


def _tagged_pids(tag: str) -> list[int]:
    """Every live process started by this run (they inherit the tag in their environment)."""
    needle = f"{TAG_ENV}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _kill_tagged(tag: str) -> None:
    for pid in _tagged_pids(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop_job(proc: subprocess.Popen[bytes], tag: str, grace_s: float = 5.0) -> None:
    """Stop a job the way ``scancel`` would (SIGTERM, then SIGKILL), leaving no process behind."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # mp.spawn children share the launcher's group
    _kill_tagged(tag)  # torchrun workers run in sessions of their own
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    deadline = time.monotonic() + grace_s
    while _tagged_pids(tag) and time.monotonic() < deadline:
        _kill_tagged(tag)
        time.sleep(0.1)


def _ready_ranks(paths: list[Path]) -> set[int]:
    ranks: set[int] = set()
    for path in paths:
        files = sorted(path.rglob("*.log")) if path.is_dir() else [path]
        for file in files:
            with contextlib.suppress(OSError):
                ranks.update(int(m) for m in READY_RE.findall(file.read_text(errors="replace")))
    return ranks


def wait_ready(
    proc: subprocess.Popen[bytes], paths: list[Path], expected: int, timeout_s: float
) -> str | None:
    """Wait until ``expected`` distinct ranks printed SCENARIO_READY; return an error or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(_ready_ranks(paths)) >= expected:
            return None
        if proc.poll() is not None:
            return f"job exited ({proc.returncode}) before all ranks were ready"
        time.sleep(0.2)
    return f"only ranks {sorted(_ready_ranks(paths))} ready after {timeout_s}s"


def collect_bundle(pid: int, run_dir: Path, logs: list[Path]) -> Path:
    from ddp_autopsy.collectors import CollectOptions, collect

    out = run_dir / "bundle"
    result = collect(CollectOptions(pid=pid, out=out, logs=logs, deadline_s=60, step_timeout_s=10))
    bundle = getattr(result, "bundle", None) or getattr(result, "out", None) or out
    return Path(bundle)


def run_scenario(name: str, workdir: Path) -> ScenarioRun:
    """Launch scenario ``name`` in ``workdir/<name>`` and return what it produced."""
    spec = SCENARIOS[name]
    launch = spec.launch
    run_dir = Path(workdir) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    console = run_dir / "console.log"
    console.write_bytes(b"")
    log_dir = run_dir / "torchrun_logs" if launch.get("log_dir") else None
    ctx = RunContext(
        spec=spec,
        dir=run_dir,
        master_addr=str(launch.get("master_addr", "127.0.0.1")),
        master_port=free_port(),
    )
    tag = f"{name}-{uuid.uuid4().hex[:12]}"
    run = ScenarioRun(
        name=name,
        dir=run_dir,
        console=console,
        returncode=None,
        bundle=None,
        log_dir=log_dir,
        duration_s=0.0,
        expect=spec.expect,
        master_port=ctx.master_port,
    )
    started = time.monotonic()
    setup = SETUPS[spec.setup] if spec.setup else None
    for attempt in range(int(launch.get("attempts", 1))):
        with (
            setup(ctx, attempt) if setup else contextlib.nullcontext(),
            console.open("ab") as out,
        ):
            proc = subprocess.Popen(
                build_command(ctx, log_dir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=build_env(ctx, tag),
                cwd=run_dir,
                start_new_session=True,
            )
            try:
                if spec.hang:
                    _drive_hang(run, proc, ctx, log_dir)
                    rc: int | None = None
                else:
                    rc = proc.wait(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                run.error = f"attempt {attempt} still running after {spec.timeout_s}s; killed"
                rc = None
            finally:
                stop_job(proc, tag)
        run.returncodes.append(rc)
    run.returncode = run.returncodes[-1]
    run.duration_s = round(time.monotonic() - started, 2)
    return run


def _drive_hang(
    run: ScenarioRun, proc: subprocess.Popen[bytes], ctx: RunContext, log_dir: Path | None
) -> None:
    launch = ctx.spec.launch
    watched = [run.console] + ([log_dir] if log_dir else [])
    t0 = time.monotonic()
    err = wait_ready(proc, watched, int(launch.get("ready", launch.get("nproc", 2))),
                     ctx.spec.timeout_s)
    if err:
        run.error = err
        return
    run.ready_s = round(time.monotonic() - t0, 2)
    time.sleep(0.5)  # the marker is printed just before the blocking call
    t1 = time.monotonic()
    try:
        run.bundle = collect_bundle(proc.pid, run.dir, [run.console])
    except Exception as exc:  # the collector is a separate component; record, don't hide
        run.error = f"collect failed: {type(exc).__name__}: {exc}"
    run.collect_s = round(time.monotonic() - t1, 2)


def main(argv: list[str] | None = None) -> int:
    """``python tests/scenarios/runner.py [NAME ...] [--out DIR]``: run and summarize."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("names", nargs="*", help=f"default: all of {sorted(SCENARIOS)}")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ddp_autopsy_scenarios"))
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    names = args.names or sorted(SCENARIOS)
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        for run in pool.map(lambda n: run_scenario(n, args.out), names):
            print(
                f"{run.name:32s} rc={run.returncodes!s:12s} {run.duration_s:6.1f}s "
                f"bundle={'yes' if run.bundle else 'no ':3s} {run.error or ''}",
                flush=True,
            )
    print(f"total {time.monotonic() - t0:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
