"""Read one text source into typed events.

The bulk of a log never matches anything: a vectorised polars pre-filter (one Rust regex made of
every pattern's literal needles) keeps only candidate lines, and only those are parsed in Python.
Sources are read in chunks, so memory does not grow with the file. Multi-line messages (Python
tracebacks, torchelastic's failure summary) are assembled by small per-source state machines.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import polars as pl

from ddp_autopsy.analyzer import patterns as P
from ddp_autopsy.analyzer.lines import LineInfo, parse_line
from ddp_autopsy.analyzer.sources import InputNote

CHUNK_BYTES = 16 << 20
TEXT_LIMIT = 2000

EVENT_SCHEMA: dict[str, Any] = {
    "source": pl.String,
    "line": pl.Int64,
    "kind": pl.String,
    "rank": pl.Int64,
    "local_rank": pl.Int64,
    "host": pl.String,
    "pid": pl.Int64,
    "cue": pl.String,
    "ts": pl.Datetime("us"),
    "level": pl.String,
    "text": pl.String,
    "data": pl.String,
}

FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


def _rust_escape(s: str) -> str:
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in s)


PREFILTER = "|".join(
    [_rust_escape(n) for n in (*P.NEEDLES, *P.EXCEPTION_NEEDLES, *P.ELASTIC_NEEDLES, 'File "')]
    + list(P.EXTRA_FILTERS)
)


@dataclass
class FileContext:
    """What the file itself says about who wrote it (path, bundle manifest)."""

    display: str
    year: int
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    cue: str | None = None


@dataclass
class _State:
    tracebacks: dict[tuple[Any, Any], dict[str, Any]] = field(default_factory=dict)
    elastic_section: str | None = None
    elastic_entry: dict[str, Any] | None = None
    spawn_index: dict[tuple[Any, Any], int] = field(default_factory=dict)


@dataclass
class ScanStats:
    lines: int = 0
    bytes: int = 0
    candidates: int = 0


def iter_text_chunks(fh: IO[bytes], display: str, notes: list[InputNote]) -> Iterator[str]:
    """Decode a byte stream in newline-aligned chunks; note (once) replaced invalid bytes."""
    first = fh.read(CHUNK_BYTES)
    encoding = "utf-8"
    if first[:2] in (b"\xff\xfe", b"\xfe\xff"):
        encoding = "utf-16"
    elif b"\x00" in first[:8192]:
        notes.append(InputNote(display, "binary file (NUL bytes), not read as a log", "info"))
        return
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    warned = False
    chunk = first
    while chunk:
        text = decoder.decode(chunk)
        if not warned and "\ufffd" in text:
            notes.append(InputNote(display, "invalid UTF-8 bytes were replaced by U+FFFD", "info"))
            warned = True
        yield text
        chunk = fh.read(CHUNK_BYTES)
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def scan_text(
    fh: IO[bytes], ctx: FileContext, notes: list[InputNote], stats: ScanStats | None = None
) -> list[dict[str, Any]]:
    """Scan one source; return event rows (see :data:`EVENT_SCHEMA`)."""
    stats = stats or ScanStats()
    events: list[dict[str, Any]] = []
    state = _State()
    carry = ""
    line_no = 0
    try:
        for text in iter_text_chunks(fh, ctx.display, notes):
            stats.bytes += len(text)
            text = carry + text
            cut = text.rfind("\n")
            if cut < 0:
                carry = text
                continue
            carry = text[cut + 1 :]
            line_no = _scan_block(text[:cut], line_no, ctx, state, events, stats)
    except (OSError, EOFError, ValueError) as err:
        notes.append(InputNote(ctx.display, f"read stopped after line {line_no} "
                                            f"(truncated or corrupt: {err})"))
    if carry:
        line_no = _scan_block(carry, line_no, ctx, state, events, stats)
    _flush_elastic(state, ctx, events)
    stats.lines += line_no
    return events


def _scan_block(
    block: str, line_no: int, ctx: FileContext, state: _State, events: list[dict[str, Any]],
    stats: ScanStats,
) -> int:
    frame = (
        pl.DataFrame({"text": [block]})
        .select(pl.col("text").str.split("\n"))
        .explode("text")
        .with_row_index("line", offset=line_no + 1)
    )
    n = frame.height
    cands = frame.filter(pl.col("text").str.contains(PREFILTER))
    stats.candidates += cands.height
    for line, raw in cands.iter_rows():
        _classify(int(line), raw.rstrip("\r"), ctx, state, events)
    return line_no + n


def _row(kind: str, line: int, info: LineInfo, ctx: FileContext, text: str,
         data: dict[str, Any], ts: datetime | None = None) -> dict[str, Any]:
    rank, cue = info.rank, info.cue
    if rank is None and ctx.rank is not None:
        rank, cue = ctx.rank, ctx.cue
    return {
        "source": ctx.display,
        "line": line,
        "kind": kind,
        "rank": rank,
        "local_rank": info.local_rank if info.local_rank is not None else ctx.local_rank,
        "host": info.host or ctx.host,
        "pid": info.pid or ctx.pid,
        "cue": cue,
        "ts": ts or info.ts,
        "level": info.level,
        "text": text[:TEXT_LIMIT],
        "data": json.dumps(data, default=str) if data else None,
    }


def _classify(line: int, raw: str, ctx: FileContext, state: _State,
              events: list[dict[str, Any]]) -> None:
    info = parse_line(raw, ctx.year)
    body = info.body
    if _elastic(line, raw, body, ctx, state, events):
        return
    stream = (info.rank, info.local_rank)
    fm = FRAME_LINE.match(body)
    if fm:
        tb = state.tracebacks.get(stream)
        if tb is not None:
            tb["frames"] = [*tb["frames"][-4:], fm.groupdict()]
        return
    for pat in P.PATTERNS:
        if not any(n in body for n in pat.needles):
            continue
        fields = pat.match(body)
        if fields is None:
            continue
        if pat.kind == "traceback":
            state.tracebacks[stream] = {"line": line, "frames": []}
        elif pat.kind == "spawn_failed" and "index" in fields:
            # mp.spawn prints the failed child's traceback right after this header.
            state.spawn_index[stream] = int(fields["index"])
        events.append(_row(pat.kind, line, info, ctx, raw, fields))
    em = P.EXCEPTION_LINE.match(body)
    if em and not body.lstrip().startswith("Exception raised from"):
        tb = state.tracebacks.pop(stream, None)
        data: dict[str, Any] = {"type": em.group("type"), "msg": (em.group("msg") or "")[:1000]}
        if tb is not None:
            data["traceback_line"] = tb["line"]
            if tb["frames"]:
                last = tb["frames"][-1]
                data["frame"] = {"file": last["file"], "line": int(last["line"]),
                                 "func": last["func"].strip()}
        index = state.spawn_index.pop(stream, None)
        if index is not None and info.rank is None:
            info.rank, info.cue = index, "mp.spawn process index"
            data["spawn_index"] = index
        events.append(_row("exception", line, info, ctx, raw, data))


def _elastic(line: int, raw: str, body: str, ctx: FileContext, state: _State,
             events: list[dict[str, Any]]) -> bool:
    """torchelastic's ChildFailedError summary: one ``elastic_failure`` event per entry."""
    if P.ELASTIC_ROOT.match(body):
        _flush_elastic(state, ctx, events)
        state.elastic_section = "root"
        return True
    if P.ELASTIC_FAILURES.match(body):
        _flush_elastic(state, ctx, events)
        state.elastic_section = "failures"
        return True
    if state.elastic_section is None:
        return False
    m = P.ELASTIC_ENTRY.match(body)
    if m:
        _flush_elastic(state, ctx, events)
        state.elastic_entry = {"line": line, "raw": raw, "root": state.elastic_section == "root"}
        return True
    m = P.ELASTIC_FIELD.match(body)
    if m and state.elastic_entry is not None:
        key = m.group("key")
        if key not in state.elastic_entry:
            state.elastic_entry[key] = m.group("value").strip()
            state.elastic_entry[f"{key}@"] = (line, raw)
        return True
    # Anything else ends the summary block.
    _flush_elastic(state, ctx, events)
    state.elastic_section = None
    return False


ELASTIC_RANK = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<lr>\d+)\)")
ELASTIC_EXIT = re.compile(r"(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")


def _flush_elastic(state: _State, ctx: FileContext, events: list[dict[str, Any]]) -> None:
    entry, state.elastic_entry = state.elastic_entry, None
    if not entry or "rank" not in entry:
        return
    data: dict[str, Any] = {"root": entry["root"]}
    rm = ELASTIC_RANK.match(entry["rank"])
    xm = ELASTIC_EXIT.match(entry.get("exitcode", ""))
    if rm:
        data["rank"], data["local_rank"] = int(rm.group("rank")), int(rm.group("lr"))
    if xm:
        data["exitcode"], data["pid"] = int(xm.group("code")), int(xm.group("pid"))
    for key in ("host", "time", "traceback", "error_file"):
        if key in entry:
            data[key] = entry[key]
    ts = None
    if "time" in entry:
        try:
            ts = datetime.strptime(entry["time"], "%Y-%m-%d_%H:%M:%S")
        except ValueError:
            ts = None
    info = LineInfo(body="", rank=data.get("rank"), local_rank=data.get("local_rank"),
                    host=data.get("host"), pid=data.get("pid"),
                    cue="torchelastic failure summary")
    # Evidence quotes a real line: the exit code (or the rank) line of the entry.
    line, text = entry.get("exitcode@") or entry.get("rank@") or (entry["line"], entry["raw"])
    events.append(_row("elastic_failure", line, info, ctx, text, data, ts))
