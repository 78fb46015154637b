"""The bundle directory and the action framework: every step is a recorded, time-bounded action.

An action is one command run (``kind="command"``), one file copied (``"file"``) or one in-process
probe (``"probe"``). Each runs with ``timeout = min(step timeout, time left before the global
deadline)``; an action that would start after the deadline is recorded as ``skipped``. A command
that times out is killed with its process group and keeps its partial output; a probe that times
out is abandoned in a daemon thread (its result is dropped, never written late).

Every write is atomic (temp file + rename) and redacted; ``manifest.json`` is rewritten after each
phase so a killed collect still leaves a readable bundle with ``"complete": false``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from ddp_autopsy.redact import redact_obj, redact_text

SCHEMA = "ddp-autopsy/bundle/1"
MIN_BUDGET_S = 0.001  # below this an action is not started at all

# Action / stack statuses; "timeout" and "absent" are different facts.
OK, TIMEOUT, ERROR, SKIPPED, ABSENT = "ok", "timeout", "error", "skipped", "absent"
PERMISSION_DENIED, EXITED, NOT_PYTHON = "permission_denied", "exited", "not_python"

T = TypeVar("T")


def now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


class Deadline:
    """The global time budget of one collect run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self._end = self.started + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def budget(self, step_timeout: float) -> float:
        return min(step_timeout, self.remaining())


@dataclass
class Action:
    """One manifest ``actions`` entry."""

    name: str
    kind: str  # command | file | probe
    target: str | None = None
    path: str | None = None
    command: list[str] | None = None
    status: str = OK
    exit_code: int | None = None
    started: str = field(default_factory=now_iso)
    duration_s: float = 0.0
    timeout_s: float | None = None
    timeout_hit: bool = False
    truncated: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "command": self.command,
                "target": self.target, "path": self.path, "status": self.status,
                "exit_code": self.exit_code, "started": self.started,
                "duration_s": round(self.duration_s, 4), "timeout_s": self.timeout_s,
                "timeout_hit": self.timeout_hit, "truncated": self.truncated, "error": self.error}


@dataclass
class Bounded(Generic[T]):
    """Outcome of :func:`run_bounded`: ``done`` is False when the call was abandoned."""

    done: bool
    value: T | None = None
    error: BaseException | None = None
    action: Action | None = None  # the manifest record, once run through Bundle.probe


def run_bounded(fn: Callable[[], T], timeout: float, name: str = "probe") -> Bounded[T]:
    """Run ``fn`` in a daemon thread and wait at most ``timeout`` seconds for it.

    A daemon thread, not a pool worker: a call stuck in the kernel (``/proc`` of a D-state process,
    a DNS lookup) must not keep the interpreter from exiting.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported to the caller, never raised in the thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"ddp-autopsy:{name}", daemon=True)
    thread.start()
    thread.join(max(timeout, 0.0))
    if thread.is_alive():
        return Bounded(done=False)
    return Bounded(done=True, value=box.get("value"), error=box.get("error"))


@dataclass
class CommandResult:
    argv: list[str]
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timeout_hit: bool
    duration_s: float
    error: str | None = None  # could not start (not found, not executable)
    action: Action | None = None  # the manifest record, once run through Bundle.command


def run_command(argv: list[str], timeout: float) -> CommandResult:
    """Run ``argv`` with a timeout; on timeout kill its process group and keep partial output."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env={**os.environ, "LC_ALL": "C"})
    except OSError as exc:
        return CommandResult(argv, None, b"", b"", False, time.monotonic() - start,
                             error=f"{type(exc).__name__}: {exc}")
    timeout_hit = False
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.001))
    except subprocess.TimeoutExpired:
        timeout_hit = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        try:
            out, err = proc.communicate(timeout=2.0)  # returns what was read before the kill
        except subprocess.TimeoutExpired:  # a grandchild still holds the pipes: give up on them
            out, err = b"", b""
    return CommandResult(argv, proc.returncode, out or b"", err or b"", timeout_hit,
                         time.monotonic() - start)


def cap_bytes(data: bytes, limit: int) -> tuple[bytes, bool]:
    """Keep head and tail of ``data`` around a marker line when it exceeds ``limit``."""
    if len(data) <= limit:
        return data, False
    half = limit // 2
    marker = f"\n[ddp-autopsy: {len(data) - 2 * half} bytes omitted]\n".encode()
    return data[:half] + marker + data[-half:], True


class Bundle:
    """A bundle directory being written: files, action records and the manifest."""

    def __init__(self, root: Path, deadline: Deadline,
                 on_action: Callable[[Action], None] | None = None) -> None:
        self.root = root
        self.deadline = deadline
        self.actions: list[Action] = []
        self.manifest: dict[str, Any] = {}
        self._on_action = on_action
        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)

    # -- files -------------------------------------------------------------------------------
    def path(self, rel: str) -> Path:
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest

    def write_bytes(self, rel: str, data: bytes) -> Path:
        dest = self.path(rel)
        tmp = dest.with_name(f".{dest.name}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def write_text(self, rel: str, text: str, *, redact: bool = True) -> Path:
        data = redact_text(text) if redact else text
        return self.write_bytes(rel, data.encode(errors="surrogateescape"))

    def write_json(self, rel: str, obj: Any, *, redact: bool = True) -> Path:
        data = redact_obj(obj) if redact else obj
        return self.write_bytes(rel, (json.dumps(data, indent=2, default=str) + "\n").encode())

    # -- actions -----------------------------------------------------------------------------
    def record(self, action: Action) -> Action:
        with self._lock:
            self.actions.append(action)
        if self._on_action is not None:
            self._on_action(action)
        return action

    def budget(self, step_timeout: float) -> float | None:
        """Timeout for an action about to start, or ``None`` when the deadline has passed."""
        budget = self.deadline.budget(step_timeout)
        return budget if budget >= MIN_BUDGET_S else None

    def skipped(self, name: str, kind: str, target: str | None, path: str | None = None,
                command: list[str] | None = None) -> Action:
        return self.record(Action(name=name, kind=kind, target=target, path=path,
                                  command=command, status=SKIPPED,
                                  error="deadline reached before this step started"))

    def command(self, name: str, argv: list[str], *, target: str | None, path: str | None,
                step_timeout: float, max_bytes: int = 64 << 20) -> CommandResult | None:
        """Run a command as an action and write its (redacted) stdout to ``path``.

        Returns ``None`` when skipped for the deadline. The caller may refine the record's
        ``status``/``error`` (e.g. py-spy's ``permission_denied``) through the returned action.
        """
        timeout = self.budget(step_timeout)
        if timeout is None:
            self.skipped(name, "command", target, path, argv)
            return None
        started = now_iso()
        result = run_command(argv, timeout)
        written: str | None = None
        truncated = False
        if path and result.stdout:  # also a failed or killed command's partial output
            data, truncated = cap_bytes(result.stdout, max_bytes)
            self.write_text(path, data.decode(errors="surrogateescape"))
            written = path
        status = OK
        if result.timeout_hit:
            status = TIMEOUT
        elif result.error is not None:
            status = ABSENT if "FileNotFoundError" in result.error else ERROR
        elif result.exit_code != 0:
            status = ERROR
        error = result.error
        if error is None and status == ERROR:
            error = summarize_stderr(result.stderr)
        elif result.timeout_hit:
            error = f"timed out after {timeout:.2f}s (partial output kept)"
        action = Action(name=name, kind="command", target=target, path=written, command=argv,
                        status=status, exit_code=result.exit_code, started=started,
                        duration_s=result.duration_s, timeout_s=round(timeout, 3),
                        timeout_hit=result.timeout_hit, truncated=truncated,
                        error=redact_text(error) if error else None)
        result.action = action
        self.record(action)
        return result

    def probe(self, name: str, fn: Callable[[], T], *, target: str | None,
              step_timeout: float, path: str | None = None, kind: str = "probe",
              grace_s: float = 0.0) -> Bounded[T] | None:
        """Run ``fn`` as a bounded action; when it finishes in time and ``path`` is given, write
        its return value there as JSON. Returns ``None`` when skipped for the deadline.
        ``grace_s`` extends the timeout for a ``fn`` that stops itself at its budget."""
        timeout = self.budget(step_timeout)
        if timeout is None:
            self.skipped(name, kind, target, path)
            return None
        timeout += grace_s
        started, t0 = now_iso(), time.monotonic()
        outcome = run_bounded(fn, timeout, name)
        action = Action(name=name, kind=kind, target=target, started=started,
                        timeout_s=round(timeout, 3), duration_s=time.monotonic() - t0)
        if not outcome.done:
            action.status, action.timeout_hit = TIMEOUT, True
            action.error = f"timed out after {timeout:.2f}s"
        elif outcome.error is not None:
            action.status = ERROR
            action.error = redact_text(f"{type(outcome.error).__name__}: {outcome.error}")
        elif path is not None:
            self.write_json(path, outcome.value)
            action.path = path
        outcome.action = action
        self.record(action)
        return outcome

    # -- manifest ----------------------------------------------------------------------------
    def write_manifest(self, *, complete: bool, duration_s: float) -> dict[str, Any]:
        with self._lock:
            actions = [a.to_dict() for a in self.actions]
        manifest = {**self.manifest, "complete": complete, "duration_s": round(duration_s, 3),
                    "actions": actions}
        with self._manifest_lock:
            self.write_json("manifest.json", manifest)
        return manifest


def summarize_stderr(stderr: bytes, limit: int = 600) -> str | None:
    """The useful part of a tool's stderr: drop Rust/anyhow backtraces, join lines."""
    text = stderr.decode(errors="replace").split("Stack backtrace:")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines)[:limit] or None
