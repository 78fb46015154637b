"""``ddp-autopsy watch`` and ``ddp-autopsy run``: the click commands (registered by ``cli``).

Exit codes: ``watch`` 0 when the job ended without a hang or failure, 1 when it hung or failed
(bundles and reports are in ``--out``), 2 usage error or no (single) job, 130 interrupted.
``run`` exits with the job's own exit code (2 for usage errors before it started).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import click

from ddp_autopsy.collectors.jobs import CollectError
from ddp_autopsy.watch.watcher import Watcher, WatchOptions, _Ended


def _options(f):  # click decorators
    opts = [
        click.option("--hang-after", type=click.FloatRange(min=1.0), default=300.0,
                     show_default=True,
                     help="Declare a hang after this many seconds without progress (well below "
                          "NCCL's 600-1800 s timeouts)."),
        click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
                     help="Directory for events.jsonl, bundles and reports "
                          "[default: ./ddp-autopsy-watch-<host>-<timestamp>]."),
        click.option("--logs", "log_paths", multiple=True, type=click.Path(path_type=Path),
                     help="Extra log file or directory of the job to follow and collect."),
        click.option("--shared-dir", type=click.Path(path_type=Path, file_okay=False),
                     default=None,
                     help="Directory every node's watcher can reach: when one triggers, all "
                          "collect (docs/watch.md)."),
        click.option("--node", default=None, help="This watcher's name in --shared-dir "
                                                  "[default: the hostname]."),
        click.option("--on-hang", "on_hang", default=None,
                     help="Shell command run after a hang is collected ($DDP_AUTOPSY_BUNDLE, "
                          "$DDP_AUTOPSY_REPORT, $DDP_AUTOPSY_REASON)."),
        click.option("--upload", "upload", default=None, metavar="URL",
                     help="Upload each hang's bundle (and a failed job's logs) to this "
                          "post-mortem service (ddp-autopsy serve)."),
        click.option("--upload-token", envvar="DDP_AUTOPSY_TOKEN", default=None,
                     help="Upload token (also DDP_AUTOPSY_TOKEN)."),
        click.option("--kill-after", type=click.FloatRange(min=0.0), default=None,
                     help="After a hang is collected, end the job (SIGTERM to the launcher) if "
                          "it made no progress for this many more seconds."),
        click.option("--once", is_flag=True, help="Stop watching after the first hang."),
        click.option("--interval", type=click.FloatRange(min=0.1), default=1.0,
                     show_default=True, help="Seconds between two /proc and log checks."),
        click.option("--deadline", type=click.FloatRange(min=1.0), default=60.0,
                     show_default=True, help="Bound on each collect."),
        click.option("--step-timeout", type=click.FloatRange(min=0.1), default=10.0,
                     show_default=True, help="Bound on each py-spy sample and collect step."),
        click.option("--color/--no-color", default=None, help="Force colours on or off."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _watch_options(hang_after: float, out: Path | None, log_paths: tuple[Path, ...],
                   shared_dir: Path | None, node: str | None, on_hang: str | None,
                   upload: str | None, upload_token: str | None, kill_after: float | None,
                   once: bool, interval: float, deadline: float, step_timeout: float,
                   color: bool | None, **kw: object) -> WatchOptions:
    return WatchOptions(hang_after=hang_after, out=out, logs=list(log_paths),
                        shared_dir=shared_dir, node=node, on_hang=on_hang, upload=upload,
                        upload_token=upload_token,
                        kill_after=kill_after, once=once, tick=interval, deadline_s=deadline,
                        step_timeout_s=step_timeout, color=color, **kw)  # type: ignore[arg-type]


@click.command("watch")
@click.option("--pid", type=int, default=None,
              help="The launcher (torchrun / mp.spawn parent) or any rank of the job.")
@click.option("--job", "job_key", default=None,
              help="Job key (as listed when several jobs run), launcher pid or run id.")
@_options
def watch_command(pid: int | None, job_key: str | None, **kw: object) -> None:
    """Watch a running job on this node; on a hang or a crash, collect, analyze, report.

    Finds the job as collect does (--pid, --job, or the only job). Detects a hang without
    touching the job: py-spy samples (non-blocking, only while the logs are quiet), log growth,
    CPU time per rank; collects the bundle before NCCL's watchdog kills the job.
    """
    if pid is not None and job_key is not None:
        raise click.UsageError("give --pid or --job, not both")
    opts = _watch_options(pid=pid, job=job_key, **kw)  # type: ignore[arg-type]
    stop = threading.Event()
    try:
        with _stoppable(stop):
            code = Watcher(opts, stop=stop, echo=_echo).run()
    except CollectError as exc:
        click.echo(f"ddp-autopsy watch: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_options
def run_command(command: tuple[str, ...], **kw: object) -> None:
    """Launch a job under watch: ddp-autopsy run [OPTIONS] -- torchrun ... train.py

    The job's output goes to <out>/console.log and is echoed here; the watcher follows the job
    as `watch` does and, when the job exits non-zero, collects its logs and analyzes them.
    Exits with the job's exit code.
    """
    opts = _watch_options(**kw)  # type: ignore[arg-type]
    stop = threading.Event()
    watcher_out = opts.out
    try:
        proc, console = _launch(list(command), watcher_out)
    except OSError as exc:
        click.echo(f"ddp-autopsy run: cannot start {command[0]!r}: {exc.strerror or exc}",
                   err=True)
        sys.exit(2)
    opts.out = console.parent
    opts.logs = [console, *opts.logs]
    echo_stop = threading.Event()
    echoer = threading.Thread(target=_follow, args=(console, echo_stop), daemon=True)
    echoer.start()
    code = 1
    try:
        with _stoppable(stop, child=proc):
            watcher = Watcher(opts, child=proc, stop=stop, echo=_echo)
            try:
                code = watcher.run()
            except _Ended as ended:
                code = ended.code
                watcher.event("ended", f"the job exited with code {code} before it started "
                              "any rank", exit_code=code)
                if code != 0:
                    watcher._analyze([console], console.parent / "postmortem", None)
    except CollectError as exc:
        click.echo(f"ddp-autopsy run: {exc}", err=True)
        code = 2
    finally:
        if proc.poll() is None and stop.is_set():
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
        echo_stop.set()
        echoer.join(timeout=2)
    sys.exit(code)


def _launch(command: list[str], out: Path | None) -> tuple[subprocess.Popen[bytes], Path]:
    from datetime import datetime
    from socket import gethostname

    out = out or Path.cwd() / f"ddp-autopsy-watch-{gethostname()}-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    console = out / "console.log"
    with open(console, "ab") as fh:  # the job writes a regular file: collect copies it
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return proc, console


def _follow(path: Path, stop: threading.Event) -> None:
    """Echo the job's console to our stdout as it grows."""
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                continue
            if stop.is_set():
                return
            stop.wait(0.2)


def _echo(line: str) -> None:
    click.echo(line, err=True)


@contextlib.contextmanager
def _stoppable(stop: threading.Event,
               child: subprocess.Popen[bytes] | None = None) -> Iterator[None]:
    """SIGINT / SIGTERM stop the watcher; for ``run``, SIGTERM is passed on to the job (a
    terminal's Ctrl-C reaches the job by itself). A second signal raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        if child is not None and signum == signal.SIGTERM and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
