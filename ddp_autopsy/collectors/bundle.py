"""The bundle directory and the action framework: every step is a recorded, time-bounded action.

An action is one command run (``kind="command"``), one file copied (``"file"``) or one in-process
probe (``"probe"``). Each runs with ``timeout = min(step timeout, time left before the global
deadline)``; an action that would start after the deadline is recorded as ``skipped``. A command
that times out is killed with its process group and keeps its partial output; a probe that times
out is abandoned in a daemon thread (its result is dropped, never written late).

Every write is atomic (temp file + rename) and redacted; ``manifest.json`` is rewritten after each
phase so a killed collect still leaves a readable bundle with ``"complete": false``. Directories
are created 0700 and files 0600: a bundle is private to the user who collected it until shared.

An interrupt (:meth:`Deadline.cancel`, from SIGINT / SIGTERM) ends the deadline at once: steps not
started are skipped, running commands are killed, copies stop at their next chunk, and
:meth:`Bundle.settle` waits for the threads still at work and removes every temp file.
"""

from __future__ import annotations

import contextlib
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

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.redact import redact_obj, redact_text

SCHEMA = layout.SCHEMA
MIN_BUDGET_S = 0.001  # below this an action is not started at all

# Action / stack statuses; "timeout" and "absent" are different facts.
OK, TIMEOUT, ERROR, SKIPPED, ABSENT = "ok", "timeout", "error", "skipped", "absent"
PERMISSION_DENIED, EXITED, NOT_PYTHON = "permission_denied", "exited", "not_python"

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600  # every directory and file of a bundle
SETTLE_GRACE_S = 5.0
DEADLINE_ERROR = "deadline reached before this step started"
INTERRUPTED_ERROR = "collect was interrupted before this step started"
INTERRUPTED_DURING = "collect was interrupted during this step"

T = TypeVar("T")


def now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


class Deadline:
    """The global time budget of one collect run; :meth:`cancel` (an interrupt) ends it now."""

    def __init__(self, seconds: float, cancel_event: threading.Event | None = None) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self._end = self.started + seconds
        self.cancel_event = cancel_event or threading.Event()

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def remaining(self) -> float:
        if self.cancel_event.is_set():
            return 0.0
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def budget(self, step_timeout: float) -> float:
        return min(step_timeout, self.remaining())


class StopAt(float):
    """A ``time.monotonic()`` instant for code that stops itself with ``now > stop_at`` (the log
    copy): it compares as already past once ``cancel`` is set, so an interrupt stops the copy at
    its next chunk. (A float subclass: its reflected comparisons run before float's own.)"""

    cancel: threading.Event

    def __new__(cls, at: float, cancel: threading.Event) -> StopAt:
        obj = super().__new__(cls, at)
        obj.cancel = cancel
        return obj

    def __lt__(self, other: object) -> bool:  # other > self: past the instant
        return self.cancel.is_set() or float(self) < other  # type: ignore[operator]

    def __le__(self, other: object) -> bool:
        return self.cancel.is_set() or float(self) <= other  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:  # other < self: not yet past
        return not self.cancel.is_set() and float(self) > other  # type: ignore[operator]

    def __ge__(self, other: object) -> bool:
        return not self.cancel.is_set() and float(self) >= other  # type: ignore[operator]

    def __hash__(self) -> int:
        return float.__hash__(self)

    def __eq__(self, other: object) -> bool:
        return float.__eq__(self, other)


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


POLL_S = 0.05  # how often a wait looks at the cancel event
CANCEL_GRACE_S = 1.0  # after a cancel, how long a wait still gives the step to finish


def run_bounded(fn: Callable[[], T], timeout: float, name: str = "probe",
                cancel: threading.Event | None = None,
                live: set[threading.Thread] | None = None) -> Bounded[T]:
    """Run ``fn`` in a daemon thread and wait at most ``timeout`` seconds for it (less when
    ``cancel`` is set meanwhile). ``live`` holds the thread while it runs.

    A daemon thread, not a pool worker: a call stuck in the kernel (``/proc`` of a D-state process,
    a DNS lookup) must not keep the interpreter from exiting.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported to the caller, never raised in the thread
            box["error"] = exc
        finally:
            if live is not None:
                live.discard(threading.current_thread())

    thread = threading.Thread(target=target, name=f"ddp-autopsy:{name}", daemon=True)
    if live is not None:
        live.add(thread)
    thread.start()
    end = time.monotonic() + max(timeout, 0.0)
    while thread.is_alive() and (left := end - time.monotonic()) > 0:
        if cancel is not None and cancel.is_set():  # a step that heeds it ends promptly
            thread.join(min(left, CANCEL_GRACE_S))
            break
        thread.join(min(left, POLL_S) if cancel is not None else left)
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


def run_command(argv: list[str], timeout: float,
                cancel: threading.Event | None = None) -> CommandResult:
    """Run ``argv`` with a timeout (cut short by ``cancel``); on timeout kill its process group
    and keep partial output."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env={**os.environ, "LC_ALL": "C"})
    except OSError as exc:
        return CommandResult(argv, None, b"", b"", False, time.monotonic() - start,
                             error=f"{type(exc).__name__}: {exc}")
    timeout_hit = False
    end = time.monotonic() + max(timeout, 0.001)
    try:
        while True:  # in slices, to notice an interrupt (communicate may be called again)
            left = end - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                raise subprocess.TimeoutExpired(argv, timeout)
            try:
                out, err = proc.communicate(timeout=min(left, POLL_S) if cancel else left)
                break
            except subprocess.TimeoutExpired:
                continue
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
        self.live: set[threading.Thread] = set()  # probe threads still running
        root.parent.mkdir(parents=True, exist_ok=True)  # outside the bundle: as mkdir -p
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=PRIVATE_DIR)
        os.chmod(root, PRIVATE_DIR)

    # -- files -------------------------------------------------------------------------------
    def path(self, rel: str) -> Path:
        """``rel`` inside the bundle, its directories created 0700."""
        dest = self.root / rel
        d = self.root
        for part in dest.relative_to(self.root).parts[:-1]:
            d = d / part
            with contextlib.suppress(FileExistsError):
                d.mkdir(mode=PRIVATE_DIR)
        return dest

    def write_bytes(self, rel: str, data: bytes) -> Path:
        dest = self.path(rel)
        tmp = dest.with_name(f".{dest.name}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     PRIVATE_FILE)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return dest

    def stop_at(self, budget: float) -> StopAt:
        """``time.monotonic()`` + ``budget``, reached at once when collect is interrupted."""
        return StopAt(time.monotonic() + budget, self.deadline.cancel_event)

    def settle(self, grace_s: float = SETTLE_GRACE_S) -> list[str]:
        """After an interrupt or a crash: wait (at most ``grace_s``) for the threads still at
        work, then remove every temp file in the bundle. Returns the bundle paths removed."""
        end = time.monotonic() + grace_s
        for thread in list(self.live):
            thread.join(max(0.0, end - time.monotonic()))
        removed = []
        for path in sorted(self.root.rglob(".*")):
            if path.is_file() and path.name.endswith((".tmp", ".tail")):
                path.unlink(missing_ok=True)
                removed.append(str(path.relative_to(self.root)))
        return removed

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
        why = INTERRUPTED_ERROR if self.deadline.cancelled else DEADLINE_ERROR
        return self.record(Action(name=name, kind=kind, target=target, path=path,
                                  command=command, status=SKIPPED, error=why))

    def command(self, name: str, argv: list[str], *, target: str | None, path: str | None,
                step_timeout: float, max_bytes: int = 64 << 20,
                keep: Callable[[bytes], bytes] | None = None) -> CommandResult | None:
        """Run a command as an action and write its (redacted) stdout to ``path``; ``keep``
        chooses what of the output is written (what it drops never reaches the disk).

        Returns ``None`` when skipped for the deadline. The caller may refine the record's
        ``status``/``error`` (e.g. py-spy's ``permission_denied``) through the returned action.
        """
        timeout = self.budget(step_timeout)
        if timeout is None:
            self.skipped(name, "command", target, path, argv)
            return None
        started = now_iso()
        result = run_command(argv, timeout, self.deadline.cancel_event)
        written: str | None = None
        truncated = False
        kept = keep(result.stdout) if keep and result.stdout else result.stdout
        if path and kept:  # also a failed or killed command's partial output
            data, truncated = cap_bytes(kept, max_bytes)
            self.write_text(path, data.decode(errors="surrogateescape"))
            written = path
        status = OK
        interrupted = result.timeout_hit and self.deadline.cancelled
        if interrupted:
            status = SKIPPED
        elif result.timeout_hit:
            status = TIMEOUT
        elif result.error is not None:
            status = ABSENT if "FileNotFoundError" in result.error else ERROR
        elif result.exit_code != 0:
            status = ERROR
        error = result.error
        if error is None and status == ERROR:
            error = summarize_stderr(result.stderr)
        elif interrupted:
            error = INTERRUPTED_DURING
        elif result.timeout_hit:
            error = f"timed out after {timeout:.2f}s (partial output kept)"
        action = Action(name=name, kind="command", target=target, path=written, command=argv,
                        status=status, exit_code=result.exit_code, started=started,
                        duration_s=result.duration_s, timeout_s=round(timeout, 3),
                        timeout_hit=result.timeout_hit and not interrupted, truncated=truncated,
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
        outcome = run_bounded(fn, timeout, name, self.deadline.cancel_event, self.live)
        action = Action(name=name, kind=kind, target=target, started=started,
                        timeout_s=round(timeout, 3), duration_s=time.monotonic() - t0)
        if not outcome.done and self.deadline.cancelled:
            action.status, action.error = SKIPPED, INTERRUPTED_DURING
        elif not outcome.done:
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
            self.write_json(layout.MANIFEST, manifest)
        return manifest


def summarize_stderr(stderr: bytes, limit: int = 600) -> str | None:
    """The useful part of a tool's stderr: drop Rust/anyhow backtraces, join lines."""
    text = stderr.decode(errors="replace").split("Stack backtrace:")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines)[:limit] or None
