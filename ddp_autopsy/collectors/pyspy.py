"""py-spy stack dumps of one process: ``stack.json`` (``--json``) and ``stack.txt``.

``--nonblocking`` by default: py-spy reads the target's memory without stopping it, so the job is
never paused. ``--native`` (opt-in) needs ptrace and pauses the process for the sample; py-spy
refuses to combine it with ``--nonblocking``, so native mode drops it.

A failed dump gets one status, from py-spy's stderr and whether the process still exists::

    permission_denied  ptrace not allowed (see PTRACE_REMEDY)
    exited             the process is gone
    not_python         py-spy found no Python interpreter in it
    timeout            py-spy did not finish within its timeout (killed, partial output kept)
    error              anything else (py-spy missing, unreadable output …)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.collectors import procs
from ddp_autopsy.collectors.bundle import (
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


def find_pyspy() -> str | None:
    """``py-spy`` on PATH, else next to the running interpreter (a venv's ``bin/``)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def dump_argv(pyspy: str, pid: int, *, as_json: bool, native: bool) -> list[str]:
    argv = [pyspy, "dump", "--pid", str(pid)]
    if as_json:
        argv.append("--json")
    argv.append("--native" if native else "--nonblocking")
    return argv


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


def dump_process(bundle: Bundle, pyspy: str | None, pid: int, *, native: bool,
                 step_timeout: float) -> StackDump:
    """Both dumps of ``pid``, one after the other (two ptrace attaches would collide)."""
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
        text_res = _run(bundle, pyspy, pid, as_json=False, native=native,
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
                          target=f"pid {pid}", path=path, step_timeout=step_timeout)


def _refine(result: CommandResult, status: str, error: str | None) -> None:
    if result.action is not None:
        result.action.status = status
        result.action.error = error if status != OK else None


def _json_path(bundle: Bundle, rel: str) -> str | None:
    """``rel`` if it holds valid JSON (a timed-out dump may be cut mid-document)."""
    try:
        json.loads((bundle.root / rel).read_text())
    except (OSError, ValueError):
        return None
    return rel
