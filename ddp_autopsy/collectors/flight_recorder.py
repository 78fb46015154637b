"""Flight Recorder: trigger a dump through the debug pipe, then pick up the dump files.

* **Trigger.** With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` (and a trace buffer > 0), process
  group 0 of each rank creates the FIFO ``<stem><rank>.pipe``; any write to it makes that rank dump
  its trace and carry on. We open it ``O_WRONLY | O_NONBLOCK``: ``ENXIO`` means no reader (the
  watchdog is gone or never listened) — recorded, never waited on.
* **Pick-up.** Dumps are ``<prefix><global rank>`` for the prefixes in ``TORCH_FR_DUMP_TEMP_FILE``
  / ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` / ``TORCHCOMM_FR_DUMP_TEMP_FILE`` and the defaults
  ``/tmp/nccl_trace_rank_`` and ``${XDG_CACHE_HOME:-$HOME/.cache}/torch/nccl_trace_rank_`` (and
  ``comm_lib_trace_rank_`` in both places).
  Files older than the job's launcher are left out (``skipped_stale``). They are copied verbatim
  into ``fr/``: a dump is a pickle, and text redaction would corrupt it; JSON dumps are redacted.

The paths come from the job's environment, so pipes are opened, directories listed and dumps read
through :class:`~ddp_autopsy.collectors.access.Access`: only what the job's own user may write,
list and read.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.collectors.access import Access, Refused, reason
from ddp_autopsy.collectors.bundle import PERMISSION_DENIED, Bundle
from ddp_autopsy.redact import redact_obj

PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
               "TORCHCOMM_FR_DUMP_TEMP_FILE")
DEFAULT_NAMES = ("nccl_trace_rank_", "comm_lib_trace_rank_")
MAX_DUMP_BYTES = 512 << 20
STALE_SLACK_S = 2.0


@dataclass
class FrPlan:
    pipes: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    named: list[str] = field(default_factory=list)  # the prefixes the job's environment names


def plan(workers: Iterable[tuple[int | None, dict[str, str], str | None]]) -> FrPlan:
    """Pipes to poke and dump prefixes to search, from ``(rank, env, cwd)`` of the job's workers.

    torch opens the paths as given, so a relative pipe stem or prefix is relative to the
    worker's working directory, not to ours."""
    out = FrPlan()
    prefixes: dict[str, None] = {}
    cache_dirs: dict[str, None] = {}
    for rank, env, cwd in workers:
        stem = _absolute(env.get(PIPE_VAR), cwd)
        if stem:
            if rank is not None:
                out.pipes.append(f"{stem}{rank}.pipe")
            else:  # mp.spawn child: rank unknown, take every pipe of the stem
                out.pipes.extend(sorted(glob.glob(glob.escape(stem) + "*.pipe")))
        for var in PREFIX_VARS:
            prefix = _absolute(env.get(var), cwd)
            if prefix:
                prefixes.setdefault(prefix, None)
                out.named.append(prefix)
        home = env.get("XDG_CACHE_HOME") or (env["HOME"] + "/.cache" if env.get("HOME") else None)
        if home:
            cache_dirs.setdefault(home, None)
    cache_dirs.setdefault(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), None)
    for name in DEFAULT_NAMES:
        prefixes.setdefault(f"/tmp/{name}", None)
        for cache in cache_dirs:
            prefixes.setdefault(f"{cache}/torch/{name}", None)
    out.pipes = list(dict.fromkeys(out.pipes))
    out.named = list(dict.fromkeys(out.named))
    out.prefixes = list(prefixes)
    return out


def _absolute(path: str | None, cwd: str | None) -> str | None:
    if not path or os.path.isabs(path) or not cwd:
        return path or None
    return os.path.join(cwd, path)


def poke_pipe(path: str, access: Access | None = None) -> str:
    """Write one byte to a Flight Recorder FIFO without blocking; returns the outcome word:
    ``triggered``, ``no_reader`` (ENXIO), ``absent``, ``not_fifo``, ``refused: …`` (the job's
    user may not write it) or ``error: …``."""
    try:
        fd = (access or Access(None)).open(path, "fifo")
    except FileNotFoundError:
        return "absent"
    except Refused as exc:
        return f"refused: {reason(exc)}"
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return "not_fifo"
        return "no_reader" if exc.errno == errno.ENXIO else f"error: {exc.strerror}"
    try:
        os.write(fd, b"1\n")
    except OSError as exc:
        return "no_reader" if exc.errno in (errno.EPIPE, errno.EAGAIN) else f"error: {exc}"
    finally:
        os.close(fd)
    return "triggered"


def trigger(bundle: Bundle, fr: FrPlan, *, step_timeout: float,
            access: Access | None = None) -> list[dict[str, Any]]:
    """Poke every pipe (each a probe action); returns ``[{pipe, result}]``."""
    results = []
    for pipe in fr.pipes:
        outcome = bundle.probe("flight recorder trigger", lambda p=pipe: poke_pipe(p, access),
                               target=pipe, step_timeout=step_timeout)
        result = outcome.value if outcome and outcome.done and outcome.error is None else None
        if outcome and outcome.action and result not in ("triggered", None):
            outcome.action.status = "absent" if result in ("absent", "not_fifo") else "error"
            outcome.action.error = result
        results.append({"pipe": pipe, "result": result or "timeout"})
    return results


def find_dumps(prefixes: Iterable[str], since: float | None, access: Access | None = None,
               refused: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``(fresh, stale)`` dump files for the prefixes; stale ones predate ``since``. A prefix's
    directory is listed only when the job's user may list it (else ``"<dir>: <why>"`` goes to
    ``refused``)."""
    fresh, stale = [], []
    for prefix in prefixes:
        folder, stem = os.path.split(prefix)
        try:
            names = (access or Access(None)).listdir(folder or ".")
        except Refused as exc:
            if refused is not None:
                refused.append(f"{folder}: {reason(exc)}")
            continue
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if not name.startswith(stem) or path.endswith((".pipe", ".tmp")):
                continue
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if since is not None and st.st_mtime < since - STALE_SLACK_S:
                stale.append(path)
            else:
                fresh.append(path)
    return list(dict.fromkeys(fresh)), list(dict.fromkeys(stale))


def wait_for_dumps(prefixes: list[str], since: float, expected: int, timeout: float,
                   access: Access | None = None) -> None:
    """After a trigger: wait (bounded) until ``expected`` dumps newer than ``since`` exist and
    their sizes stopped changing."""
    end = time.monotonic() + timeout
    last: dict[str, int] = {}
    while time.monotonic() < end:
        fresh, _ = find_dumps(prefixes, since + STALE_SLACK_S, access)
        sizes = {}
        for path in fresh:
            try:
                sizes[path] = os.path.getsize(path)
            except OSError:
                continue
        if len(sizes) >= expected and sizes == last:
            return
        last = sizes
        time.sleep(0.25)


def copy_dumps(bundle: Bundle, paths: list[str], *, step_timeout: float,
               access: Access | None = None, refused: list[str] | None = None) -> list[str]:
    """Copy dumps into ``fr/`` (one ``file`` action each, read as the job's user may: a refusal
    goes to ``refused``); returns bundle-relative paths."""
    copied: list[str] = []
    used: set[str] = set()
    for src in paths:
        name = Path(src).name
        rel = layout.fr_dump(name)
        n = 1
        while rel in used:  # same name under two prefixes' directories
            rel = layout.fr_dump(name, n)
            n += 1
        used.add(rel)
        outcome = bundle.probe("copy flight recorder dump",
                               lambda s=src, r=rel: _copy(bundle, s, r, access),
                               target=src, step_timeout=step_timeout, kind="file")
        if outcome and outcome.done and outcome.error is None and outcome.action:
            outcome.action.path = rel
            copied.append(rel)
        elif outcome and outcome.action and isinstance(outcome.error, Refused):
            outcome.action.status = PERMISSION_DENIED
            outcome.action.error = f"refused: {reason(outcome.error)}"
            if refused is not None:
                refused.append(f"{src}: {reason(outcome.error)}")
    return copied


def _copy(bundle: Bundle, src: str, rel: str, access: Access | None = None) -> None:
    fd = (access or Access(None)).open(src)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_DUMP_BYTES:
            raise OSError(f"{size} bytes, over the {MAX_DUMP_BYTES} byte limit for a dump")
        data = fh.read(MAX_DUMP_BYTES + 1)
    try:
        parsed = json.loads(data)
    except ValueError:
        bundle.write_bytes(rel, data)  # pickle: verbatim
        return
    bundle.write_bytes(rel, json.dumps(redact_obj(parsed)).encode())
