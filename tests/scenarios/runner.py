"""Run the scenario library: real failing PyTorch distributed jobs (Gloo on CPU).

Each ``tests/scenarios/<name>.py`` is a job program (runnable as a script) that declares,
at module level and as plain literals, how to launch it and what it should demonstrate::

    LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "hang": False, "timeout_s": 60}
    EXPECT = {"cause": "rank_crashed", "ranks": [2], "notes": "..."}
    SETUP = "occupy_master_port"          # optional: a runner-side fixture, see SETUPS

The runner reads those with :mod:`ast` (it never imports the program, so never imports torch),
launches the job as a user would and captures the launcher's combined stdout+stderr to
``console.log``, as a terminal or a SLURM ``.out`` file would. Hang scenarios are collected
with :func:`ddp_autopsy.collectors.collect` once every rank has printed
``SCENARIO_READY rank=N``; then the job is stopped like ``scancel`` would (SIGTERM, SIGKILL).

LAUNCH keys (all optional except ``launcher``):

``launcher``      ``"torchrun"``: ``python -m torch.distributed.run ... program.py``;
                  ``"python"``: ``python program.py`` (it calls ``torch.multiprocessing.spawn``);
                  ``"procs"``: one ``python program.py`` per rank with RANK / WORLD_SIZE set,
                  all writing to the same console, like ``srun python train.py``.
``nproc``         torchrun ``--nproc-per-node``.
``world_size``    procs: WORLD_SIZE; ``ranks``: which ranks to start (default all).
``args``          extra program arguments.
``env``           extra environment for the job.
``master_addr``   torchrun ``--master-addr`` / ``MASTER_ADDR`` (default ``127.0.0.1``).
``log_dir``       pass ``--log-dir <run>/torchrun_logs``.
``tee``           pass ``--tee 3`` (console lines prefixed ``[default<local_rank>]:``).
``redirects``     pass ``--redirects 3`` (worker output only in the log dir).
``torchrun_args`` more torchrun options, e.g. ``["--rdzv-conf", "timeout=5"]``.
``attempts``      launch the job this many times, appending to the same console.log.
``hang``          the job hangs: wait for ``ready`` markers, collect, then stop it.
``ready``         number of ``SCENARIO_READY`` markers to wait for (default ``nproc``).
``signal``        once every rank is ready, send this signal (e.g. ``"SIGHUP"``) to the launcher,
                  as a closing terminal or the scheduler would, and let it stop the job.
``timeout_s``     bound on each attempt (and on the wait for ready markers).

Master ports are picked per run (free, below the ephemeral range). Every process of a run
carries ``DDP_AUTOPSY_SCENARIO_TAG=<unique>`` in its environment, so the runner can stop
exactly its own processes, including torchrun workers that run in sessions of their own.

``python tests/scenarios/runner.py [NAME ...]`` runs scenarios and prints a summary.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCENARIO_DIR = Path(__file__).resolve().parent
READY_RE = re.compile(r"SCENARIO_READY rank=(\d+)")
TAG_ENV = "DDP_AUTOPSY_SCENARIO_TAG"
LAUNCHERS = ("torchrun", "python", "procs")
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
    "TORCH_SHOW_CPP_STACKTRACES",
    "NCCL_DEBUG",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
)
# Master ports come from below the kernel's ephemeral range (32768+), where Gloo's own
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
    returncode: int | None  # last attempt; None when the runner had to stop the job
    bundle: Path | None  # hang scenarios: what collect() wrote
    log_dir: Path | None  # torchrun --log-dir
    duration_s: float
    expect: dict[str, Any]
    returncodes: list[int | None] = field(default_factory=list)  # one per attempt
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    launcher_pid: int | None = None  # last attempt
    ready_s: float | None = None  # hang scenarios: seconds until every rank was ready
    collect_s: float | None = None  # hang scenarios: seconds spent in collect()
    skipped: str | None = None  # why this machine cannot reproduce the scenario
    error: str | None = None  # runner-side problem: markers never seen, collect failed, ...

    def console_text(self) -> str:
        """The launcher's console plus, for the ``procs`` launcher, every rank's own file."""
        paths = [self.console, *self.rank_files()]
        return "".join(p.read_text(errors="replace") for p in paths if p.exists())

    def rank_files(self) -> list[Path]:
        """``rank<N>.log`` files of the ``procs`` launcher (one per process, like srun -o)."""
        return sorted(self.dir.glob("rank*.log"))

    def rank_logs(self) -> dict[int, dict[str, Path]]:
        """torchrun ``--log-dir`` files: ``{local_rank: {"stdout": path, "stderr": path}}``."""
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
    if launch.get("launcher") not in LAUNCHERS:
        raise ValueError(f"{path.name}: LAUNCH['launcher'] must be one of {LAUNCHERS}")
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
        for _ in range(500):
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


@dataclass
class SetupEffect:
    """What a setup changes about one launch."""

    wrap: list[str] = field(default_factory=list)  # prefix for every launched command
    env: dict[str, str] = field(default_factory=dict)
    skip: str | None = None  # the scenario cannot be reproduced on this machine: why


Setup = Callable[["RunContext", int], contextlib.AbstractContextManager[SetupEffect]]


@contextlib.contextmanager
def occupy_master_port(ctx: RunContext, attempt: int) -> Iterator[SetupEffect]:
    """Another process listens on the master port (a stale job on the node) for every attempt."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", ctx.master_port))
        sock.listen()
        yield SetupEffect()


@contextlib.contextmanager
def occupy_master_port_first_attempt(ctx: RunContext, attempt: int) -> Iterator[SetupEffect]:
    """The master port is held during the first attempt only, then freed (the stale job died)."""
    if attempt == 0:
        with occupy_master_port(ctx, attempt) as effect:
            yield effect
    else:
        yield SetupEffect()


_BIND_HOSTS = 'mount --bind "$0" /etc/hosts && exec "$@"'


@functools.cache
def private_mount_namespace() -> list[str] | None:
    """``unshare`` options giving a job its own mount namespace, if this machine allows it."""
    if shutil.which("unshare") is None:
        return None
    for opts in (["-m"], ["-r", "-m"]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            probe = subprocess.run(
                ["unshare", *opts, "sh", "-c", "mount --bind /etc/hosts /etc/hosts"],
                capture_output=True,
                timeout=10,
            )
            if probe.returncode == 0:
                return ["unshare", *opts]
    return None


@contextlib.contextmanager
def master_resolves_late(ctx: RunContext, attempt: int) -> Iterator[SetupEffect]:
    """The master's hostname becomes resolvable only after the job has failed to resolve it.

    Like a Kubernetes headless-service DNS record that appears after the pods start. The job
    gets a private copy of /etc/hosts, bind-mounted in its own mount namespace (the machine's
    file is untouched), and the runner appends ``127.0.0.1 <master_addr>`` to it
    ``resolve_after_s`` after the job's first resolution warning.
    """
    unshare = private_mount_namespace()
    if unshare is None:
        yield SetupEffect(
            skip="needs `unshare -m` (a mount namespace) to give the job its own "
            "/etc/hosts, which this machine does not permit"
        )
        return
    hosts = ctx.dir / "etc_hosts"
    shutil.copyfile("/etc/hosts", hosts)
    console = ctx.dir / "console.log"
    after = float(ctx.spec.launch.get("resolve_after_s", 3))
    stop = threading.Event()

    def publish() -> None:
        # Not on a bare timer: on a loaded machine the job may reach rendezvous only after the
        # record is there, and then there is no warning to survive. Wait for the first one.
        deadline = time.monotonic() + 10 * after
        while not stop.wait(0.1) and time.monotonic() < deadline:
            if console.exists() and b"cannot be retrieved" in console.read_bytes():
                break
        if stop.is_set():
            return
        stop.wait(after)
        with hosts.open("a") as fh:  # in place: the bind mount follows the inode
            fh.write(f"127.0.0.1 {ctx.master_addr}\n")

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        yield SetupEffect(wrap=[*unshare, "sh", "-c", _BIND_HOSTS, str(hosts)])
    finally:
        stop.set()
        publisher.join()


# A setup is entered around each attempt: fn(ctx, attempt) -> context manager of SetupEffect.
SETUPS: dict[str, Setup] = {
    "occupy_master_port": occupy_master_port,
    "occupy_master_port_first_attempt": occupy_master_port_first_attempt,
    "master_resolves_late": master_resolves_late,
}

SCENARIOS: dict[str, ScenarioSpec] = discover()


# --------------------------------------------------------------------------- launching


def build_commands(
    ctx: RunContext, log_dir: Path | None, tag: str
) -> list[tuple[list[str], dict[str, str]]]:
    """The processes to start for one attempt: ``[(argv, env), ...]``, the launcher first."""
    launch, spec = ctx.spec.launch, ctx.spec
    program = [str(spec.path), *map(str, launch.get("args", []))]
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update({k: str(v) for k, v in launch.get("env", {}).items()})
    env[TAG_ENV] = tag
    if launch["launcher"] == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
        cmd += ["--nproc-per-node", str(launch.get("nproc", 2))]
        cmd += ["--master-addr", ctx.master_addr, "--master-port", str(ctx.master_port)]
        if log_dir is not None:
            cmd += ["--log-dir", str(log_dir)]
        if launch.get("tee"):
            cmd += ["--tee", "3"]
        if launch.get("redirects"):
            cmd += ["--redirects", "3"]
        cmd += [str(a) for a in launch.get("torchrun_args", [])]
        return [(cmd + program, env)]
    env.update(MASTER_ADDR=ctx.master_addr, MASTER_PORT=str(ctx.master_port))
    if launch["launcher"] == "python":
        return [([sys.executable, *program], env)]
    world_size = int(launch["world_size"])
    return [
        (
            [sys.executable, *program],
            {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world_size)},
        )
        for r in launch.get("ranks", range(world_size))
    ]


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


def stop_job(procs: list[subprocess.Popen[bytes]], tag: str, grace_s: float = 5.0) -> None:
    """Stop a job the way ``scancel`` would (SIGTERM, then SIGKILL), leaving no process behind."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # mp.spawn children share the launcher's group
    deadline = time.monotonic() + grace_s
    while (pids := _tagged_pids(tag)) and time.monotonic() < deadline:
        _kill_tagged(tag)  # torchrun workers run in sessions of their own
        time.sleep(0.1)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if pids:
        raise RuntimeError(f"processes of {tag} survived SIGKILL: {pids}")


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
    return f"only ranks {sorted(_ready_ranks(paths))} were ready after {timeout_s}s"


def collect_bundle(pid: int, run_dir: Path, logs: list[Path]) -> Path:
    """Run the real collector against the live job, as ``ddp-autopsy collect`` would."""
    from ddp_autopsy.collectors import CollectOptions, collect

    out = run_dir / "bundle"
    result = collect(CollectOptions(pid=pid, out=out, logs=logs, deadline_s=60, step_timeout_s=10))
    found = getattr(result, "bundle", None) or getattr(result, "out", None)
    return Path(found) if isinstance(found, (str, Path)) else out


def _drive_hang(
    run: ScenarioRun, launcher: subprocess.Popen[bytes], ctx: RunContext, log_dir: Path | None
) -> None:
    launch = ctx.spec.launch
    watched = [run.console, *run.rank_files()] + ([log_dir] if log_dir else [])
    expected = int(launch.get("ready", launch.get("nproc", 2)))
    t0 = time.monotonic()
    err = wait_ready(launcher, watched, expected, ctx.spec.timeout_s)
    if err:
        run.error = err
        return
    run.ready_s = round(time.monotonic() - t0, 2)
    time.sleep(0.5)  # the marker is printed just before the blocking call
    t1 = time.monotonic()
    try:
        run.bundle = collect_bundle(launcher.pid, run.dir, [run.console, *run.rank_files()])
    except Exception as exc:  # the collector is a separate component: record, don't hide
        run.error = f"collect failed: {type(exc).__name__}: {exc}"
    run.collect_s = round(time.monotonic() - t1, 2)


def _drive_signal(
    run: ScenarioRun, launcher: subprocess.Popen[bytes], ctx: RunContext, log_dir: Path | None
) -> None:
    """Wait for every rank to be ready, then signal the launcher from outside."""
    launch = ctx.spec.launch
    watched = [run.console, *run.rank_files()] + ([log_dir] if log_dir else [])
    expected = int(launch.get("ready", launch.get("nproc", 2)))
    err = wait_ready(launcher, watched, expected, ctx.spec.timeout_s)
    if err:
        run.error = err
        return
    time.sleep(0.5)
    launcher.send_signal(getattr(signal, str(launch["signal"])))


def run_scenario(name: str, workdir: Path) -> ScenarioRun:
    """Launch scenario ``name`` in ``workdir/<name>`` and return what it produced."""
    spec = SCENARIOS[name]
    launch = spec.launch
    run_dir = Path(workdir) / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    console = run_dir / "console.log"
    console.touch()
    log_dir = run_dir / "torchrun_logs" if launch.get("log_dir") else None
    ctx = RunContext(
        spec=spec,
        dir=run_dir,
        master_addr=str(launch.get("master_addr", "127.0.0.1")),
        master_port=free_port(),
    )
    run = ScenarioRun(
        name=name,
        dir=run_dir,
        console=console,
        returncode=None,
        bundle=None,
        log_dir=log_dir,
        duration_s=0.0,
        expect=spec.expect,
        master_addr=ctx.master_addr,
        master_port=ctx.master_port,
    )
    tag = f"{name}-{uuid.uuid4().hex[:12]}"
    setup = SETUPS[spec.setup] if spec.setup else None
    started = time.monotonic()
    for attempt in range(int(launch.get("attempts", 1))):
        with (
            setup(ctx, attempt) if setup else contextlib.nullcontext(SetupEffect()) as effect,
            console.open("ab") as out,
            contextlib.ExitStack() as stack,
        ):
            if effect.skip:
                run.skipped = effect.skip
                break
            procs = []
            for argv, env in build_commands(ctx, log_dir, tag):
                # One process per rank writes its own file, as with srun --output=rank%t.log.
                sink = out
                if launch["launcher"] == "procs":
                    sink = stack.enter_context((run_dir / f"rank{env['RANK']}.log").open("ab"))
                procs.append(subprocess.Popen(
                    [*effect.wrap, *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env={**env, **effect.env},
                    cwd=run_dir,
                    start_new_session=True,
                ))
            run.launcher_pid = procs[0].pid
            rc: int | None = None
            try:
                if launch.get("signal"):
                    _drive_signal(run, procs[0], ctx, log_dir)
                    rc = procs[0].wait(timeout=spec.timeout_s)
                elif spec.hang:
                    _drive_hang(run, procs[0], ctx, log_dir)
                    if procs[0].poll() is not None:  # it ended by itself: keep its code
                        rc = procs[0].returncode
                else:
                    codes = [p.wait(timeout=spec.timeout_s) for p in procs]
                    rc = next((c for c in codes if c != 0), 0)
            except subprocess.TimeoutExpired:
                run.error = f"attempt {attempt} still running after {spec.timeout_s}s; stopped"
            finally:
                stop_job(procs, tag)
        run.returncodes.append(rc)
    run.returncode = run.returncodes[-1] if run.returncodes else None
    run.duration_s = round(time.monotonic() - started, 2)
    (run_dir / "run.json").write_text(json.dumps(asdict(run), indent=2, default=str) + "\n")
    return run


def main(argv: list[str] | None = None) -> int:
    """Run scenarios (default: all), two at a time, and print a summary."""
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
            status = (run.skipped and f"SKIPPED: {run.skipped}") or run.error or ""
            print(
                f"{run.name:30s} rc={run.returncodes!s:10s} {run.duration_s:6.1f}s "
                f"bundle={'yes' if run.bundle else 'no':3s} {status}",
                flush=True,
            )
    print(f"total {time.monotonic() - t0:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
