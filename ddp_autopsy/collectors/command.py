"""``ddp-autopsy collect``: the click command (registered by ``ddp_autopsy.cli``).

Exit codes: 0 when a bundle was written (even a partial one), 2 for usage errors and when no (or
no single) job was found, 1 when collection itself failed (the partial bundle is kept), 130 when
interrupted (SIGINT or SIGTERM: the partial bundle is kept, marked incomplete, without temp files
or a partial tarball; a second signal stops at once, still cleaning up).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ddp_autopsy.collectors.collect import CollectOptions, CollectResult, collect
from ddp_autopsy.collectors.jobs import CollectError


@click.command("collect")
@click.option("--pid", type=int, default=None,
              help="The launcher (torchrun / mp.spawn parent) or any rank of the job (a process "
                   "that is not part of a distributed job is refused).")
@click.option("--job", "job_key", default=None,
              help="Job key (as listed when several jobs run), launcher pid or run id.")
@click.option("--logs", "log_paths", multiple=True, type=click.Path(path_type=Path),
              help="Extra log file or directory to copy (repeatable).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Bundle directory [default: ./ddp-autopsy-<host>-<timestamp>].")
@click.option("--tar", is_flag=True, help="Also write <out>.tar.gz (mode 0600).")
@click.option("--force", is_flag=True, help="With --tar: overwrite an existing <out>.tar.gz.")
@click.option("--native", is_flag=True,
              help="Native (C/C++) frames too; pauses each process briefly (ptrace).")
@click.option("--deadline", type=click.FloatRange(min=1.0), default=60.0, show_default=True,
              help="Stop collecting after this many seconds, keeping what was gathered.")
@click.option("--step-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Timeout of each single step (one py-spy dump, one command, one probe).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.option("--upload", "upload_url", default=None, metavar="URL",
              help="Then upload the bundle to a post-mortem service (ddp-autopsy serve): the "
                   "nodes of one job join one incident (docs/server.md).")
@click.option("--token", envvar="DDP_AUTOPSY_TOKEN", default=None,
              help="Upload token (or DDP_AUTOPSY_TOKEN).")
def collect_command(pid: int | None, job_key: str | None, log_paths: tuple[Path, ...],
                    out: Path | None, tar: bool, force: bool, native: bool, deadline: float,
                    step_timeout: float, fmt: str, upload_url: str | None,
                    token: str | None) -> None:
    """Snapshot a hung or crashing distributed job on this host into a bundle directory.

    Finds the job's processes, dumps every rank's Python stacks with py-spy (without pausing
    them), records versions, environment (secrets redacted), host and network facts, and copies
    logs and Flight Recorder dumps. Every step has a timeout; the job is never harmed.
    """
    if pid is not None and job_key is not None:
        raise click.UsageError("give --pid or --job, not both")
    if force and not tar:
        raise click.UsageError("--force only applies to --tar")
    cancel = threading.Event()
    opts = CollectOptions(pid=pid, job=job_key, out=out, logs=list(log_paths),
                          deadline_s=deadline, step_timeout_s=step_timeout, native=native,
                          tar=tar, force=force, progress=fmt == "text" and sys.stderr.isatty(),
                          cancel=cancel)
    try:
        with _interruptible(cancel):
            result = collect(opts)
    except CollectError as exc:
        click.echo(f"ddp-autopsy collect: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:  # the second signal, or during discovery
        click.echo("ddp-autopsy collect: interrupted"
                   + (f"; the partial bundle {out} is marked incomplete" if out else ""), err=True)
        sys.exit(130)
    except Exception as exc:  # the bundle (if any) keeps the traceback in its manifest
        click.echo(f"ddp-autopsy collect failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    if fmt == "json":
        click.echo(json.dumps(summary(result), indent=2))
    else:
        click.echo(render_text(result))
    if result.manifest.get("interrupted"):
        click.echo(f"ddp-autopsy collect: interrupted; {result.bundle} is incomplete", err=True)
        sys.exit(130)
    if upload_url:
        _upload(result.bundle, upload_url, token)


def _upload(bundle: Path, url: str, token: str | None) -> None:
    """Send the bundle to the service; the bundle stays on disk whatever happens."""
    try:
        from ddp_autopsy.server.client import UploadError, upload
    except ImportError as exc:
        click.echo(f"ddp-autopsy collect: --upload needs the server extra "
                   f"(pip install 'ddp-autopsy[server]'): {exc}", err=True)
        sys.exit(2)
    try:
        answer = upload(bundle, url, token)
    except UploadError as exc:
        click.echo(f"ddp-autopsy collect: upload failed, the bundle is kept at {bundle}: {exc}",
                   err=True)
        sys.exit(1)
    click.echo(f"uploaded: {answer.get('url') or answer}")


@contextlib.contextmanager
def _interruptible(cancel: threading.Event) -> Iterator[None]:
    """SIGINT / SIGTERM set ``cancel`` (collect winds down, cleaning up); a second one raises
    KeyboardInterrupt. Outside the main thread (no signal handlers there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # reentrant write
            sys.stderr.write("\nddp-autopsy collect: interrupted, stopping and cleaning up "
                             "(again to stop now)\n")

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def summary(result: CollectResult) -> dict[str, Any]:
    """The ``--format json`` document."""
    m = result.manifest
    return {
        "bundle": str(result.bundle),
        "tarball": str(result.tarball) if result.tarball else None,
        "complete": m.get("complete"),
        "interrupted": bool(m.get("interrupted")),
        "job": m.get("job"),
        "processes": len(m.get("processes", [])),
        "stacks_ok": sum(p.get("stack_status") == "ok" for p in m.get("processes", [])),
        "logs": len(m.get("logs", [])),
        "fr_dumps": len(m.get("fr_dumps", [])),
        "warnings": result.warnings,
        "actions": dict(Counter(a["status"] for a in m.get("actions", []))),
    }


def render_text(result: CollectResult) -> str:
    m = result.manifest
    job = m.get("job", {})
    processes = m.get("processes", [])
    roles = Counter(p["role"] for p in processes)
    stacks = Counter(p["stack_status"] for p in processes)
    lines = [
        f"Bundle: {result.bundle}" + (f"  (+ {result.tarball})" if result.tarball else ""),
        f"Job {job.get('key')}: {job.get('launcher')}, launcher pid {job.get('launcher_pid')}, "
        f"world size {job.get('world_size') if job.get('world_size') is not None else '?'}, "
        f"master {job.get('master_addr')}:{job.get('master_port')}",
        "Processes: " + ", ".join(f"{n} {role}" for role, n in sorted(roles.items())),
        f"Stacks: {stacks.get('ok', 0)}/{len(processes)} ok"
        + "".join(f", {n} {s}" for s, n in sorted(stacks.items()) if s != "ok"),
        f"Logs: {len(m.get('logs', []))} file(s) copied"
        f" ({sum(bool(entry.get('truncated')) for entry in m.get('logs', []))} truncated); "
        f"Flight Recorder dumps: {len(m.get('fr_dumps', []))}",
        *_probe_lines(result.bundle),
        f"Took {m.get('duration_s')}s" + ("" if m.get("complete") else " (incomplete)"),
    ]
    if result.warnings:
        lines.append("Warnings:")
        lines.extend(f"  - {w}" for w in result.warnings)
    lines.append(f"Next: ddp-autopsy analyze {result.bundle}")
    return "\n".join(lines)


def _probe_lines(bundle: Path) -> list[str]:
    try:
        probes = json.loads((bundle / "network" / "probe.json").read_text())
    except (OSError, ValueError):
        return []
    lines = []
    for p in probes:
        where = f"{p.get('master_addr')}:{p.get('master_port')}"
        if p.get("status") != "ok":
            lines.append(f"Rendezvous {where}: probe {p.get('status')}")
            continue
        listening = ("listening here" + (f" (pid {p['holder_pid']})" if p.get("holder_pid")
                                         else "")) if p.get("listening_here") else \
            "not listening here"
        conn = p.get("connect") or {}
        lines.append(f"Rendezvous {where}: "
                     + ("resolves" if p.get("resolves") else "does NOT resolve")
                     + f", {listening}, connect "
                     + ("ok" if conn.get("ok") else f"failed ({conn.get('error')})"))
    return lines
