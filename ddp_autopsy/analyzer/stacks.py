"""py-spy stack dumps (``py-spy dump --json`` and the plain text form) into the ``stacks`` frame.

One row per frame; ``depth`` 0 is the innermost frame (where the thread is now).

Sample text input::

    Process 2171: /usr/bin/python3 -u train.py
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 2171 (idle): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:3252)
        <module> (train.py:8)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import polars as pl

STACK_SCHEMA: dict[str, Any] = {
    "source": pl.String,
    "host": pl.String,
    "pid": pl.Int64,
    "rank": pl.Int64,
    "local_rank": pl.Int64,
    "thread_id": pl.Int64,
    "thread_name": pl.String,
    "idle": pl.Boolean,
    "owns_gil": pl.Boolean,
    "depth": pl.Int64,
    "func": pl.String,
    "file": pl.String,
    "line": pl.Int64,
}


@dataclass
class StackOwner:
    source: str
    host: str | None = None
    pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None


class StackParseError(ValueError):
    """The input looks like a py-spy dump but is not a valid one."""


def looks_like_pyspy_json(head: bytes) -> bool:
    h = head.lstrip()[:4096]
    return h.startswith(b"[") and b'"thread_id"' in h and b'"frames"' in h


def looks_like_pyspy_text(head: bytes) -> bool:
    return bool(re.search(rb"(?m)^Thread (?:0x[0-9a-fA-F]+|\d+) \(\w+[^)]*\): ", head[:65536])) \
        and b"Python v" in head[:65536]


def parse_pyspy_json(data: bytes | str, owner: StackOwner) -> list[dict[str, Any]]:
    try:
        threads = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise StackParseError(f"py-spy JSON does not parse: {err}") from err
    if not isinstance(threads, list):
        raise StackParseError("py-spy JSON is not a list of threads")
    rows: list[dict[str, Any]] = []
    for th in threads:
        if not isinstance(th, dict):
            continue
        pid = th.get("pid") if isinstance(th.get("pid"), int) else owner.pid
        for depth, fr in enumerate(th.get("frames") or []):
            if not isinstance(fr, dict):
                continue
            rows.append({
                "source": owner.source,
                "host": owner.host,
                "pid": pid,
                "rank": owner.rank,
                "local_rank": owner.local_rank,
                "thread_id": _int(th.get("os_thread_id") or th.get("thread_id")),
                "thread_name": th.get("thread_name"),
                "idle": not th.get("active", False),
                "owns_gil": bool(th.get("owns_gil", False)),
                "depth": depth,
                "func": str(fr.get("name")),
                "file": fr.get("short_filename") or fr.get("filename"),
                "line": _int(fr.get("line")),
            })
    return rows


THREAD_RE = re.compile(
    r'^Thread (?P<tid>0x[0-9a-fA-F]+|\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>[^"]*)")?'
)
PROCESS_RE = re.compile(r"^Process (?P<pid>\d+): ")
FRAME_RE = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")


def parse_pyspy_text(text: str, owner: StackOwner) -> list[dict[str, Any]]:
    """Parse one or more concatenated ``py-spy dump`` text outputs."""
    rows: list[dict[str, Any]] = []
    pid = owner.pid
    thread: dict[str, Any] | None = None
    depth = 0
    for raw in text.splitlines():
        m = PROCESS_RE.match(raw)
        if m:
            pid, thread = int(m.group("pid")), None
            continue
        m = THREAD_RE.match(raw)
        if m:
            tid = m.group("tid")
            state = m.group("state")
            thread = {
                "thread_id": int(tid, 16) if tid.startswith("0x") else int(tid),
                "thread_name": m.group("name"),
                "idle": "idle" in state,
                "owns_gil": "gil" in state.lower(),
            }
            depth = 0
            continue
        m = FRAME_RE.match(raw)
        if m and thread is not None:
            rows.append({
                "source": owner.source, "host": owner.host, "pid": pid, "rank": owner.rank,
                "local_rank": owner.local_rank, **thread, "depth": depth,
                "func": m.group("func"), "file": m.group("file"), "line": int(m.group("line")),
            })
            depth += 1
    return rows


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None
