"""py-spy stack dumps of one process: ``stack.json`` (``--json``) and ``stack.txt``.

``--nonblocking`` by default: py-spy reads the target's memory without stopping it, so the job is
never paused. ``--native`` (opt-in) needs ptrace and pauses the process for the sample; py-spy
refuses to combine it with ``--nonblocking``, so native mode drops it — for the JSON dump only:
the text dump (Python frames, and the header naming the Python version) stays ``--nonblocking``.
A native dump reads every loaded library's symbols first (libtorch: 0.3-2 s a process, measured),
so one native dump per process instead of two halves the cost and the pauses.

A failed dump gets one status, from py-spy's stderr and whether the process still exists::

    permission_denied  ptrace not allowed (see PTRACE_REMEDY)
    exited             the process is gone
    not_python         py-spy found no Python interpreter in it
    timeout            py-spy did not finish within its timeout (killed, partial output kept)
    error              anything else (py-spy missing, unreadable output …)

When py-spy fails for any reason but the process's exit (missing, not permitted, a Python it
cannot read such as 3.14, a timeout), :func:`fallback` asks the interpreter itself, in this order:

1. ``python -m profiling.sampling dump -a PID`` (CPython 3.15+, run with the target's own
   executable, as the tool must match the target's version): reads the process like py-spy,
   without touching it;
2. the job's own ``faulthandler``, when the job declared the signal it registered
   (:mod:`~ddp_autopsy.collectors.faulthandler`).

Either gives threads in py-spy's ``dump --json`` shape (the analysis reads them unchanged), and
the dump says where it came from (``StackDump.source``, ``note``). Otherwise the reason no stack
could be taken is kept with the py-spy error.

``DDP_AUTOPSY_PYSPY`` names the py-spy executable to use (instead of the one on ``PATH``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.collectors import faulthandler, procs
from ddp_autopsy.collectors.bundle import (
    ABSENT,
    ERROR,
    EXITED,
    NOT_PYTHON,
    OK,
    PERMISSION_DENIED,
    SKIPPED,
    TIMEOUT,
    Bundle,
    CommandResult,
    summarize_stderr,
)

PTRACE_REMEDY = (
    "py-spy may not read this process: run collect as the job's user or as root with "
    "CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE; kubernetes: securityContext.capabilities.add "
    "[SYS_PTRACE]) and/or relax kernel.yama.ptrace_scope (sysctl kernel.yama.ptrace_scope=0)"
)
_DENIED = ("permission denied", "operation not permitted")  # matched lower-cased
_NOT_PYTHON = ("Failed to find python version", "Failed to find a python interpreter",
               "not a python process")


PYSPY_ENV = "DDP_AUTOPSY_PYSPY"


def find_pyspy() -> str | None:
    """``$DDP_AUTOPSY_PYSPY`` when set (used as given: a wrong path fails each dump, and the
    fallbacks run), else ``py-spy`` on PATH, else next to the running interpreter (a venv's
    ``bin/``)."""
    if os.environ.get(PYSPY_ENV):
        return os.environ[PYSPY_ENV]
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def dump_argv(pyspy: str, pid: int, *, as_json: bool, native: bool) -> list[str]:
    argv = [pyspy, "dump", "--pid", str(pid)]
    if as_json:  # with the locals, of which :func:`keep_call_args` keeps a few numbers
        argv += ["--json", "--locals"]
    argv.append("--native" if native else "--nonblocking")
    return argv




def keep_call_args(stdout: bytes) -> bytes:
    """A ``py-spy dump --locals --json`` document with every local dropped but the
    :data:`~ddp_autopsy.bundle_layout.CALL_ARGS` of torch.distributed's own frames whose value
    is a number, a bool or None (``"locals": [{"name": "src", "repr": "1", ...}]``): the other
    locals may hold anything and are never written. Output that does not parse is not written
    at all."""
    try:
        threads = json.loads(stdout)
    except ValueError:
        return b""
    if not isinstance(threads, list):
        return b""
    for thread in threads:
        for frame in (thread.get("frames") or []) if isinstance(thread, dict) else []:
            if not isinstance(frame, dict) or "locals" not in frame:
                continue
            kept = [{"name": v["name"], "repr": v["repr"], "arg": bool(v.get("arg"))}
                    for v in layout.call_arg_locals(frame)]
            del frame["locals"]
            if kept:
                frame["locals"] = kept
    return json.dumps(threads).encode()


SPAWN_WRAP = ("_wrap", "multiprocessing/spawn.py")


def spawn_index_from_dump(threads: Any) -> int | None:
    """The ``i`` argument of torch's ``mp.spawn`` entry frame ``_wrap(fn, i, args, …)`` in a
    ``py-spy dump --locals --json`` document (the index mp.spawn gave this child)."""
    for thread in threads if isinstance(threads, list) else []:
        for frame in thread.get("frames") or []:
            if frame.get("name") != SPAWN_WRAP[0] or \
                    not str(frame.get("filename", "")).endswith(SPAWN_WRAP[1]):
                continue
            for local in frame.get("locals") or []:
                if local.get("name") == "i" and str(local.get("repr", "")).isdigit():
                    return int(local["repr"])
    return None


def read_spawn_index(pyspy: str, pid: int, timeout: float) -> int | None:
    """The mp.spawn index of ``pid`` from its locals, without stopping it. Only that number is
    kept: the other locals (which may hold anything) are never written anywhere."""
    argv = [pyspy, "dump", "--pid", str(pid), "--locals", "--json", "--nonblocking"]
    out = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    try:
        return spawn_index_from_dump(json.loads(out.stdout))
    except ValueError:
        return None


def classify(result: CommandResult, pid: int) -> tuple[str, str | None]:
    """``(status, error)`` of one py-spy run."""
    if result.timeout_hit:
        limit = result.action.timeout_s if result.action else None
        return TIMEOUT, f"py-spy did not finish within {limit}s (killed; partial output kept)"
    if result.error is not None:
        return ERROR, result.error
    text = result.stderr.decode(errors="replace")
    if result.exit_code == 0 and result.stdout.strip():
        return OK, None
    alive = procs.exists(pid)
    if not alive:
        return EXITED, "process exited before or during the dump"
    if any(s in text.lower() for s in _DENIED):
        return PERMISSION_DENIED, PTRACE_REMEDY
    if any(s in text for s in _NOT_PYTHON):
        if procs.is_python(procs.read_exe(pid), procs.read_cmdline(pid) or ()):
            return ERROR, ("py-spy found no interpreter state in this Python process (starting "
                           "up or shutting down?): " + (summarize_stderr(result.stderr) or ""))
        return NOT_PYTHON, summarize_stderr(result.stderr)
    return ERROR, summarize_stderr(result.stderr) or f"py-spy exited with {result.exit_code}"


@dataclass
class StackDump:
    status: str
    error: str | None
    json_path: str | None  # bundle-relative, None when nothing usable was written
    text_path: str | None
    text: str | None  # the text dump (its header names the Python version)
    source: str = "py-spy"  # or the fallback that took it: faulthandler, profiling.sampling
    note: str | None = None  # a fallback's stack: why py-spy failed and how it was taken


# -- fallbacks when py-spy fails ----------------------------------------------------------------
_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)")
_EXE = re.compile(r"python(\d+)\.(\d+)")


def python_version(pid: int) -> tuple[int, int] | None:
    """``(3, 14)`` from the process's ``libpython3.14.so`` or executable name, if it says."""
    for path in procs.read_maps_paths(pid):
        if m := _LIBPYTHON.search(os.path.basename(path)):
            return int(m.group(1)), int(m.group(2))
    exe = procs.read_exe(pid) or ""
    m = _EXE.search(os.path.basename(os.path.realpath(exe)) if exe else "")
    return (int(m.group(1)), int(m.group(2))) if m else None


SAMPLING_MIN = (3, 15)  # python -m profiling.sampling dump appeared in CPython 3.15
_SAMPLING_HEAD = re.compile(r"^Stack dump(?: for PID (?P<pid>\d+))?(?:, thread (?P<tid>\d+))?"
                            r"(?: \((?P<details>.*)\))?:\s*$")
_SAMPLING_FRAME = re.compile(r'^  File "(?P<file>.*)"(?:, line (?P<line>\d+))?, in (?P<func>.+?)'
                             r"(?:  opcode=.*)?\s*$")


def sampling_argv(exe: str, pid: int) -> list[str]:
    """CPython's own one-shot dump of every thread (Lib/profiling/sampling/cli.py ``dump``)."""
    return [exe, "-m", "profiling.sampling", "dump", "-a", str(pid)]


def parse_sampling_dump(text: str, pid: int | None) -> list[dict[str, Any]]:
    """``python -m profiling.sampling dump`` output (Lib/profiling/sampling/dump.py: a header
    per thread ``Stack dump for PID P, thread T (main thread; idle; most recent call last):``,
    then ``  File "f", line N, in qualname`` outermost first, each followed by its source line)
    as py-spy ``dump --json`` threads, innermost frame first."""
    threads: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        m = _SAMPLING_HEAD.match(raw)
        if m:
            details = [d.strip() for d in (m.group("details") or "").split(";")]
            main = "main thread" in details
            tid = int(m.group("tid")) if m.group("tid") else len(threads)
            current = {"pid": pid, "thread_id": tid, "thread_name": "MainThread" if main else None,
                       "os_thread_id": pid if main else None,
                       "active": "idle" not in details, "owns_gil": "has GIL" in details,
                       "frames": [], "source": "profiling.sampling"}
            threads.append(current)
            continue
        f = _SAMPLING_FRAME.match(raw)
        if f and current is not None:
            path = f.group("file")
            current["frames"].insert(0, {
                "name": f.group("func"), "filename": path, "module": None,
                "short_filename": faulthandler.short_filename(path),
                "line": int(f.group("line")) if f.group("line") else None})
    return threads


def sampling_dump(pid: int, timeout: float) -> faulthandler.Dump:
    """The 3.15+ interpreter's own dump of ``pid``, with the target's own executable."""
    version = python_version(pid)
    if version is None or version < SAMPLING_MIN:
        v = ".".join(map(str, version)) if version else "unknown"
        return faulthandler.Dump("unavailable", f"python -m profiling.sampling needs Python "
                                 f"3.15+ (this process: {v})")
    exe = procs.read_exe(pid)
    if not exe or not os.access(exe, os.X_OK):
        return faulthandler.Dump("unavailable", f"the interpreter of pid {pid} ({exe}) cannot "
                                 "be run here")
    argv = sampling_argv(exe, pid)
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout, check=False,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return faulthandler.Dump("error", f"{' '.join(argv[1:4])} did not finish within "
                                 f"{timeout:g}s")
    except OSError as exc:
        return faulthandler.Dump("error", f"{exe}: {exc}")
    text = out.stdout.decode(errors="replace")
    threads = parse_sampling_dump(text, pid) if out.returncode == 0 else []
    if not threads:
        why = summarize_stderr(out.stderr) or f"exit code {out.returncode}, no stack"
        return faulthandler.Dump("error", f"python -m profiling.sampling dump: {why}")
    return faulthandler.Dump("ok", f"python -m profiling.sampling dump (Python "
                             f"{version[0]}.{version[1]})", threads, text,
                             method="profiling.sampling")


def fallback(pid: int, env: Mapping[str, str] | None, timeout: float) -> faulthandler.Dump:
    """A stack of ``pid`` without py-spy: the 3.15+ interpreter's dump, else the job's
    faulthandler. When neither works, ``detail`` says why for each. Never for a process that is
    not a Python interpreter (a shell wrapper's trap must not run)."""
    if not procs.is_python(procs.read_exe(pid), procs.read_cmdline(pid) or ()):
        if not procs.exists(pid):
            return faulthandler.Dump("exited", "process exited")
        return faulthandler.Dump("unavailable", "not a Python process")
    tried = []
    for take in (lambda: sampling_dump(pid, timeout),
                 lambda: faulthandler.take(pid, env, timeout)):
        got = take()
        if got.status in ("ok", "exited"):
            return got
        tried.append(got.detail)
    return faulthandler.Dump("unavailable", "; ".join(tried))


def dump_process(bundle: Bundle, pyspy: str | None, pid: int, *, native: bool,
                 step_timeout: float, env: Mapping[str, str] | None = None) -> StackDump:
    """Both dumps of ``pid``, one after the other (two ptrace attaches would collide); when
    py-spy fails, a :func:`fallback` stack (``env``: the process's raw environment)."""
    got = _pyspy_dumps(bundle, pyspy, pid, native=native, step_timeout=step_timeout)
    if got.status in (OK, EXITED, SKIPPED, NOT_PYTHON):
        return got
    return _fallback_dump(bundle, pid, got, env, step_timeout)


def _fallback_dump(bundle: Bundle, pid: int, failed: StackDump,
                   env: Mapping[str, str] | None, step_timeout: float) -> StackDump:
    """``failed`` (py-spy's outcome) replaced by a fallback stack, or kept with the reason no
    fallback worked appended to its error."""
    base = layout.process_dir(pid)
    budget = min(step_timeout, 10.0)
    # named py-spy…: a stack step, reported through the process's stack status (not as a
    # step_timeout problem)
    outcome = bundle.probe("py-spy fallback (profiling.sampling / faulthandler)",
                           lambda: fallback(pid, env, budget), target=f"pid {pid}",
                           step_timeout=step_timeout, grace_s=1.0)
    if outcome is None or not outcome.done or outcome.value is None:
        return failed
    got = outcome.value
    if got.status != "ok" or not got.threads:
        if outcome.action is not None:
            outcome.action.status = {"error": ERROR, "exited": EXITED}.get(got.status, ABSENT)
            outcome.action.error = got.detail
        status = EXITED if got.status == "exited" else failed.status
        return StackDump(status, f"{failed.error}; no fallback stack: {got.detail}",
                         failed.json_path, failed.text_path, failed.text)
    json_path = f"{base}/stack.json"
    bundle.write_json(json_path, got.threads)
    text_path = f"{base}/stack.txt"
    bundle.write_text(text_path, got.text or "")
    if outcome.action is not None:
        outcome.action.path = json_path
    source = got.method
    note = f"py-spy failed ({failed.status}: {failed.error}); stack taken with {got.detail}"
    return StackDump(OK, None, json_path, text_path, None, source=source, note=note)


def _pyspy_dumps(bundle: Bundle, pyspy: str | None, pid: int, *, native: bool,
                 step_timeout: float) -> StackDump:
    base = layout.process_dir(pid)
    if pyspy is None:
        return StackDump(ERROR, "py-spy not found (pip install py-spy)", None, None, None)
    json_res = _run(bundle, pyspy, pid, as_json=True, native=native, step_timeout=step_timeout,
                    path=f"{base}/stack.json")
    if json_res is None:
        why = "collect was interrupted" if bundle.deadline.cancelled else "deadline reached"
        return StackDump(SKIPPED, f"{why} before the dump", None, None, None)
    status, error = classify(json_res, pid)
    if bundle.deadline.cancelled and json_res.timeout_hit:
        status, error = SKIPPED, "collect was interrupted during the dump"
    json_path = _json_path(bundle, f"{base}/stack.json") if json_res.action and \
        json_res.action.path else None
    if status == OK and json_path is None:
        status, error = ERROR, "py-spy --json output is not valid JSON"
    _refine(json_res, status, error)
    text_res = None
    if status not in (EXITED, PERMISSION_DENIED, NOT_PYTHON, SKIPPED):
        text_res = _run(bundle, pyspy, pid, as_json=False, native=False,
                        step_timeout=step_timeout, path=f"{base}/stack.txt")
    text_path = text = None
    if text_res is not None:
        text_status, text_error = classify(text_res, pid)
        _refine(text_res, text_status, text_error)
        if text_res.action and text_res.action.path:
            text_path = text_res.action.path
            text = (bundle.root / text_path).read_text(errors="replace")
        if status != OK and text_status == OK:
            error = f"{error}; the text dump succeeded"
    return StackDump(status, error, json_path, text_path, text)


def _run(bundle: Bundle, pyspy: str, pid: int, *, as_json: bool, native: bool,
         step_timeout: float, path: str) -> CommandResult | None:
    name = "py-spy dump --json" if as_json else "py-spy dump"
    return bundle.command(name, dump_argv(pyspy, pid, as_json=as_json, native=native),
                          target=f"pid {pid}", path=path, step_timeout=step_timeout,
                          keep=keep_call_args if as_json else None)


def _refine(result: CommandResult, status: str, error: str | None) -> None:
    if result.action is not None:
        result.action.status = status
        result.action.error = error if status != OK else None


def parses_as_json(path: Path) -> bool:
    """Whether ``path`` holds valid JSON (a timed-out dump may be cut mid-document)."""
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def _json_path(bundle: Bundle, rel: str) -> str | None:
    return rel if parses_as_json(bundle.root / rel) else None
