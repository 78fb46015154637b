"""Read one text source into typed events, at the speed of the disk.

The bulk of a log never matches anything, so no Python code touches it:

1. bytes are read in newline-aligned blocks of BLOCK_BYTES (:func:`iter_blocks`; for sources
   larger than a block, on a reader thread, so that reads and decompression overlap the rest)
   and split into lines by polars, a few blocks at a time on a thread pool (polars releases the
   GIL: every core works);
2. a two-level vectorised pre-filter keeps candidate lines: three dozen short *anchors* first (a
   regex of many literals defeats the SIMD literal search, fewer keep it), then every needle of
   the catalog on the few survivors;
3. only candidates reach Python: prefixes are parsed (``lines``) and the catalog
   (``patterns``) classifies them; small per-source state machines join multi-line messages
   (Python tracebacks, torchelastic's failure summary, a message hard-wrapped over up to
   MAX_JOINED lines);
4. each writer's last line (``last_line`` events: what a rank was last doing) is found in bulk
   too: a regex names every line's writer prefixes (``lines.WriterKey``) and polars keeps the
   last line of each name; only those are parsed.

What a terminal leaves in a captured log is undone first: ANSI colours are stripped (in polars,
only in blocks that hold an escape byte), CRLF endings dropped, and a physical line holding
``\r``-redrawn progress bars and messages glued to them is read as its messages
(``lines.segments``), each with its own prefixes, all under the physical line's number.

Memory is bounded by the block size, whatever the input size. Each row keeps what its prefixes
said about its writer (``stream``); ``attribution.resolve`` fills in ranks across rows and files.
``progress_to`` reports bytes read to a callback (the CLI's progress bar).
"""

from __future__ import annotations

import bisect
import codecs
import contextvars
import dataclasses
import functools
import itertools
import json
import os
import queue
import re
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import polars as pl

from ddp_autopsy.analyzer import patterns as P
from ddp_autopsy.analyzer import timestamps
from ddp_autopsy.analyzer.attribution import SELF_RANK_CUE
from ddp_autopsy.analyzer.deferred import DeferredSchema
from ddp_autopsy.analyzer.layout import attribution_from_path
from ddp_autopsy.analyzer.lines import _ANY_PREFIX as ANY_PREFIX
from ddp_autopsy.analyzer.lines import (
    ANSI,
    NO_PREFIX,
    SAMPLE_LINES,
    FilePrefix,
    LineInfo,
    WriterKey,
    block_writers,
    detect,
    has_box,
    is_progress,
    parse_line,
    segments,
    unbox,
)
from ddp_autopsy.analyzer.sources import READ_ERRORS, InputNote
from ddp_autopsy.analyzer.timestamps import Reference

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.workers import ForkPool

BLOCK_BYTES = 4 << 20  # measured best on 2 cores: bigger blocks miss the caches
#: The reads after a file's first: a file of up to BLOCK_BYTES is one block; larger ones go on
#: in blocks of this size (1 GB srun file, blocks sifted two at a time: peak RSS 200-205 MB and
#: 2.2-2.5 CPU-s, against 226-268 MB, 2.4-2.8 CPU-s with 4 MB reads each split in two blocks).
NEXT_BYTES = 2 << 20
#: A line longer than this keeps its first and last LONG_LINE_KEEP bytes (noted).
LONG_LINE = 16 << 20
LONG_LINE_KEEP = 1 << 20
TEXT_LIMIT = 2000

EVENT_SCHEMA: Mapping[str, Any] = DeferredSchema(lambda: {
    "source": pl.String,
    "line": pl.Int64,
    "kind": pl.String,
    "rank": pl.Int64,
    "local_rank": pl.Int64,
    "host": pl.String,
    "pid": pl.Int64,
    "cue": pl.String,
    "ts": pl.Datetime("us"),
    "clock": pl.String,
    "level": pl.String,
    "stream": pl.String,
    "text": pl.String,
    "data": pl.String,
})

FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
#: An NCCL line a paste trimmed to its device and source: "[3] enqueue.cc:215 NCCL WARN ..."
NCCL_TRIMMED = re.compile(r"^(?:\[\d+\] )?[\w/.-]+\.(?:cc|cu|h):\d+ NCCL [A-Z]+ ")

#: Lines events.py reads for attribution: NCCL's communicator init maps a process to its rank
#: (``comm_rank`` in the communicator: the world rank when ``nranks`` is the world size; 2.29+
#: prefixes "[Rank N]", the job rank, which ``lines`` reads as the line's rank).
NCCL_COMM_INIT = P.Pattern(
    "nccl_comm_init",
    ("Init COMPLETE", "Init START"),
    re.compile(
        r"(?:\[Rank (?P<jobrank>\d+)\] )?(?:(?P<fn>ncclComm\w+) )?"
        r"comm (?P<comm>0x[0-9a-f]+|\(nil\)) rank (?P<comm_rank>\d+) nranks (?P<nranks>\d+)"
        r" cudaDev (?P<cuda_dev>\d+)"
        r"(?: nvmlDev \d+)? busId (?P<bus_id>[0-9a-f]+).*?(?: commId 0x(?P<comm_id>[0-9a-f]+))?"
        r" ?- Init (?P<phase>START|COMPLETE)"
    ),
    (("jobrank", int), ("comm_rank", int), ("nranks", int), ("cuda_dev", int)),
)
#: NCCL's channel set-up lines name their own process's rank in the communicator: the sender
#: (``a``) of "Channel 00/0 : 2[2] -> 3[3] via P2P/IPC" (transport/p2p.cc, shm.cc; "[send]
#: via NET/..." in net.cc), the receiver (``b``) of "... -> 4[0] [receive] via NET/IB/0"; the
#: brackets hold each one's device (nvmlDev; 2.5-2.8 its bus id in hex); NCCL <= 2.6
#: wrote "Ring 00 : 2[2] -> 1[1] via direct shared memory" and "Ring 00 : 7 -> 0 [receive] via
#: NET/IB/0".
NCCL_CHANNEL = P.Pattern(
    "nccl_channel",
    ("via P2P/", "via SHM/", "via direct shared memory", "via NET/"),
    re.compile(
        r"(?:Channel|Ring) \d+(?:/\d+)? : (?P<a>\d+)(?:\[(?P<adev>[0-9a-fx]+)\])? -> (?P<b>\d+)"
        r"(?:\[(?P<bdev>[0-9a-fx]+)\])? (?:\[(?P<dir>send|receive)\] )?via "
        r"(?:NET|P2P|SHM|direct shared memory)"
    ),
    (("a", int), ("b", int)),
)
#: Attribution patterns the catalog does not hold (yet): moving one there changes nothing here.
OWN_PATTERNS: tuple[P.Pattern, ...] = tuple(
    p for p in (NCCL_COMM_INIT, NCCL_CHANNEL) if p.kind not in {q.kind for q in P.PATTERNS}
)
#: Event kinds whose ``rank`` field is the writer's own global rank, and the cue it gives.
WRITER_RANK_FIELDS = {
    "run_start": "Lightning GLOBAL_RANK line",  # "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/4"
    "mpi_process_exit": "mpirun's report of the process",  # "... process rank 2 with PID ..."
    "lightning_deadlock": "Lightning's DeadlockDetectedException",  # "... from rank: 0"
}
PATTERNS: tuple[P.Pattern, ...] = (*P.PATTERNS, *OWN_PATTERNS)
#: Which patterns a needle may start: a candidate line is tried only against the patterns
#: whose needles polars found in it (all occurrences, overlapping ones included).
_BY_NEEDLE: dict[str, list[int]] = {}
for i, pat in enumerate(PATTERNS):
    for needle in pat.needles:
        _BY_NEEDLE.setdefault(needle, []).append(i)
del i, pat, needle
_NEEDLE_LIST = sorted(_BY_NEEDLE)
#: The needles each line holds (a polars expression; this and FIRST_LEVEL, SECOND_LEVEL are
#: built at their first use by :func:`_prefilter`, or set by ``config.install_patterns``).
FOUND: pl.Expr | None = None
#: Below this many candidates, Python's substring checks beat building FOUND's automaton (~1 ms).
FOUND_VECTORISED = 200


def _found(cands: pl.DataFrame, known: dict[int, frozenset[str]] | None = None
           ) -> Iterator[tuple[int, str, frozenset[str]]]:
    """Each candidate line with the needles it holds (``known``: by line, as Hyperscan found
    them; a line it does not hold, a failure summary's context line, is looked at here)."""
    if known is not None:
        for line, raw in cands.rows():
            found = known.get(line)
            yield line, raw, found if found is not None else \
                frozenset(n for n in _NEEDLE_LIST if n in raw)
        return
    if cands.height >= FOUND_VECTORISED:
        for line, raw, found in cands.with_columns(_prefilter()[0]).iter_rows():
            yield line, raw, frozenset(found)
        return
    for line, raw in cands.rows():
        yield line, raw, frozenset(n for n in _NEEDLE_LIST if n in raw)


@functools.lru_cache(maxsize=4096)
def _patterns_for(found: frozenset[str]) -> tuple[P.Pattern, ...]:
    return tuple(PATTERNS[i] for i in sorted({i for n in found for i in _BY_NEEDLE[n]}))


# --- the two-level pre-filter ------------------------------------------------------------------

def rust_escape(literal: str) -> str:
    """Escape for Rust's regex (``re.escape`` also escapes spaces, which older versions reject)."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in literal)


def _rx(literals: tuple[str, ...]) -> str:
    return "|".join(rust_escape(x) for x in sorted(set(literals)))


#: torchelastic's failure-summary fields ("rank      : 3 (local_rank: 3)") mean something only
#: inside the summary: they are looked for only there, see _context.
ELASTIC_FIELDS: tuple[str, ...] = tuple(
    n for n in P.ELASTIC_NEEDLES if P.ELASTIC_FIELD.match(f"  {n} x")
)
#: Every literal that makes a line worth reading in Python.
NEEDLES: tuple[str, ...] = tuple(
    n for n in (*P.NEEDLES, *P.EXCEPTION_NEEDLES, *P.ELASTIC_NEEDLES, 'File "',
                *(n for p in OWN_PATTERNS for n in p.needles))
    if n not in ELASTIC_FIELDS
)
#: Short substrings shared by many needles and rare in healthy logs (NCCL INFO/COLL lines,
#: progress bars). Needles containing none of them are added to the first level as they are.
#: What costs is the number of literals and how often their first bytes occur in the text.
ANCHORS: tuple[str, ...] = (
    "rror", "xception", "ailed", "ailure", "FAILED", "Exit", "Interrupt", 'File "', "raceback",
    "ddress", " memory", "onnect", "ollective", " GPU", "imeout", "signal", "atchdog",
    "nterface", "GLOBAL_RANK", "Init ", "Using", "version", "device type", "exceeded",
    "wrong ", "Call to ", " event", "ensors must", "elastic_operator", "OMP_NUM_THREADS",
)


def anchor_literals(needles: tuple[str, ...] = NEEDLES,
                    anchors: tuple[str, ...] = ANCHORS) -> tuple[str, ...]:
    """First-level literals: the anchors in use, plus needles that no anchor covers."""
    used = tuple(a for a in anchors if any(a in n for n in needles))
    return used + tuple(n for n in needles if not any(a in n for a in used))


FIRST_LEVEL: pl.Expr | None = None
SECOND_LEVEL: pl.Expr | None = None


def _prefilter() -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """FOUND, FIRST_LEVEL and SECOND_LEVEL, built now if not yet (polars is imported after the
    worker processes fork: no polars expression is built at import)."""
    global FOUND, FIRST_LEVEL, SECOND_LEVEL
    text = pl.col("text")
    if FOUND is None:
        FOUND = text.str.extract_many(_NEEDLE_LIST, overlapping=True).alias("found")
    if FIRST_LEVEL is None:
        FIRST_LEVEL = text.str.contains(_rx(anchor_literals(NEEDLES)))
    if SECOND_LEVEL is None:
        SECOND_LEVEL = text.str.contains(_rx(NEEDLES))
    return FOUND, FIRST_LEVEL, SECOND_LEVEL


@functools.cache
def _context() -> pl.Expr:
    """Lines that mean something only inside torchelastic's failure summary (its "[0]:" entry
    headers and fields, the catalog's extra regexes): looked for only in blocks where a summary
    opens (OPENERS) or goes on."""
    return pl.any_horizontal(
        pl.col("text").str.contains(_rx(ELASTIC_FIELDS)),
        *(pl.col("text").str.contains(x) for x in P.EXTRA_FILTERS),
    )


OPENERS: tuple[str, ...] = tuple(n for n in P.ELASTIC_NEEDLES if n not in ELASTIC_FIELDS)


# --- progress ------------------------------------------------------------------------------

_progress: contextvars.ContextVar[Callable[[str, int], None] | None] = contextvars.ContextVar(
    "ddp_autopsy_progress", default=None
)


@contextmanager
def progress_to(callback: Callable[[str, int], None]) -> Iterator[None]:
    """Within this block, every source read reports ``callback(display, bytes_read)``."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)


# --- reading -------------------------------------------------------------------------------

@dataclass
class FileContext:
    """What the file itself says about who wrote it (path, bundle manifest) and when."""

    display: str
    year: int
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    cue: str | None = None
    #: SLURM task id from the file name (a rank only if the lines confirm it).
    task: int | None = None
    #: When the file was last written (mtime, bundle manifest): the year of year-less stamps.
    ref_time: datetime | None = None

    @property
    def reference(self) -> Reference:
        return _reference(self.ref_time, self.year)

    @property
    def stream(self) -> str | None:
        """The writer the file's path names: a task, or one process (a torchrun --log-dir
        file, an NCCL_DEBUG_FILE, a bundle's log of one pid)."""
        if self.task is not None:
            return f"t={self.task}"
        return "file" if self.local_rank is not None or self.pid is not None else None


@functools.lru_cache(maxsize=256)
def _reference(ref_time: datetime | None, year: int) -> Reference:
    """(read for every line parsed: made once per file time)"""
    return Reference.at(ref_time) if ref_time else Reference(year)


@dataclass
class ScanStats:
    lines: int = 0
    bytes: int = 0
    candidates: int = 0


#: A hard-wrapped message is joined over at most this many physical lines.
MAX_JOINED = 3
#: Writer names whose last line is kept unparsed; beyond, they are parsed and the names dropped.
TAIL_NAMES = 20_000


@dataclass
class _State:
    prefix: FilePrefix = NO_PREFIX
    #: NCCL processes (``host:pid`` of their prefix) whose communicator init this file showed:
    #: their channel set-up lines say nothing more (see :func:`_redundant_channel`).
    comm_inits: set[str] = field(default_factory=set)
    #: The progress bar the message being classified was glued to, if any.
    glued_to: str | None = None
    #: Per (stream, rank): the last non-blank line (line, text, its LineInfo).
    last: dict[tuple[Any, Any], tuple[int, str, LineInfo]] = field(default_factory=dict)
    #: Per writer name (``lines.WriterKey``): its last line so far (line, text), unparsed.
    tails: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: The block being classified: its first line's number - 1 and its lines (continuations).
    block_start: int = 0
    block: _Sifted | None = None
    #: Lines up to this one were read as the continuation of a hard-wrapped message.
    joined_to: int = 0
    #: Every such line (not a writer's last line of its own).
    joined: set[int] = field(default_factory=set)
    tracebacks: dict[tuple[Any, Any], dict[str, Any]] = field(default_factory=dict)
    elastic_section: str | None = None
    elastic_entry: dict[str, Any] | None = None
    spawn_index: dict[tuple[Any, Any], int] = field(default_factory=dict)
    noted: set[str] = field(default_factory=set)
    #: Per stream: the line after a traceback frame line, and that frame line's indent (the
    #: echoed source line is indented deeper; an exception line is not).
    code_line: dict[tuple[Any, Any], tuple[int, int]] = field(default_factory=dict)
    #: Events beyond MAX_EVENTS_PER_KIND, per kind: counted, not kept.
    dropped: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    #: Needles whose every pattern's kind has its quota: lines holding only these are counted.
    spent: frozenset[str] = frozenset()
    prune_at: int = 0


#: Events kept per source and kind (the earliest); the rest are counted in a note. A log of
#: nothing but errors would otherwise hold every line in memory.
MAX_EVENTS_PER_KIND = 20_000


def _prune(events: list[dict[str, Any]], state: _State, start: int) -> None:
    """Drop the events from ``start`` on whose kind already has its quota."""
    kept, dropped = state.kept, state.dropped
    out = events[:start]
    for e in events[start:]:
        k = e["kind"]
        if kept.get(k, 0) < MAX_EVENTS_PER_KIND:
            kept[k] = kept.get(k, 0) + 1
            out.append(e)
        else:
            dropped[k] = dropped.get(k, 0) + 1
    events[:] = out
    full = {k for k, n in kept.items() if n >= MAX_EVENTS_PER_KIND}
    if full:  # the common file fills no quota: no needle is spent (and thousands of files add up)
        state.spent = frozenset(n for n, ids in _BY_NEEDLE.items()
                                if all(PATTERNS[i].kind in full for i in ids))


#: Lines classified whatever their needles: traceback frames and exception lines (a few
#: substring tests beat one regex of them).
_UNSPENT = ('File "', *P.EXCEPTION_NEEDLES)


def _spent(found: frozenset[str], raw: str, state: _State) -> bool:
    """Whether a candidate can only give events of kinds that have their quota: then it is
    counted, not classified (10 GB of watchdog lines: the work per kind is bounded too)."""
    if not found or not found <= state.spent or state.elastic_section is not None \
            or any(n in raw for n in _UNSPENT):
        return False
    kind = _kinds(found)
    state.dropped[kind] = state.dropped.get(kind, 0) + 1
    return True


@functools.lru_cache(maxsize=1024)
def _kinds(found: frozenset[str]) -> str:
    return "/".join(sorted({p.kind for p in _patterns_for(found)}))


#: NCCL_CHANNEL's needles but the one another pattern shares (its lines are classified anyway).
_CHANNEL_ONLY = frozenset(NCCL_CHANNEL.needles) - {
    n for p in P.PATTERNS for n in p.needles}
NCCL_COMM_INIT_NEEDLES = frozenset(NCCL_COMM_INIT.needles)
_PROCESS_NEEDLES = _CHANNEL_ONLY | NCCL_COMM_INIT_NEEDLES


def _nccl_process(raw: str) -> str | None:
    """``host:pid`` of an NCCL line's ``host:pid:tid`` prefix (its first word), else None."""
    head = raw.split(" ", 1)[0]
    process, _, tid = head.rpartition(":")
    return process if tid.isdigit() and process.rpartition(":")[2].isdigit() else None


def _redundant_channel(found: frozenset[str], raw: str, state: _State) -> bool:
    """Whether a line is an NCCL channel set-up line of a process whose communicator init this
    file already showed (the init names its rank; a job prints thousands of channel lines):
    notes the process of an init line as it goes."""
    if found <= _CHANNEL_ONLY:
        process = _nccl_process(raw)
        return process is not None and process in state.comm_inits
    if found & NCCL_COMM_INIT_NEEDLES and (process := _nccl_process(raw)) is not None:
        state.comm_inits.add(process)
    return False


def _looks_binary(head: bytes) -> bool:
    """NUL bytes in text mostly mean a binary file; a log can also start with a NUL-filled hole
    (truncated while a process kept writing): that one is text again after the hole."""
    text = head.replace(b"\x00", b"")
    if not text:
        return False
    control = sum(text.count(bytes([c])) for c in range(32) if c not in (9, 10, 13, 27))
    return control > 0.1 * len(text) or (len(text) > 4096 and b"\n" not in text)


#: Log exports that keep each line of the program's output as a JSON string, one object per line:
#: (what the note calls it, the field with the line, the field with its time). Docker's json-file
#: driver (/var/lib/docker/containers/<id>/<id>-json.log, Fluentd/Fluent Bit's "log"), Google
#: Cloud Logging's exports to storage, Grafana Loki's `logcli query --output=jsonl`, `journalctl
#: -o json`. Not an application's own JSON records ("message", "msg"): their traceback is in
#: another field, read where it is.
JSON_ENVELOPES: tuple[tuple[str, str, str | None], ...] = (
    ("Docker json-file log", "log", "time"),
    ("Google Cloud Logging export", "textPayload", "timestamp"),
    ("Grafana Loki JSON lines", "line", "timestamp"),
    ("journald JSON", "MESSAGE", None),
)


def json_envelope(first: bytes) -> tuple[str, str, str | None] | None:
    """The envelope whose line field the file's first line (a JSON object) holds as a string."""
    head = first.lstrip()[:1 << 20]
    if not head.startswith(b"{"):
        return None
    try:
        doc = json.loads(head.split(b"\n", 1)[0])
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    return next((e for e in JSON_ENVELOPES if isinstance(doc.get(e[1]), str)), None)


def envelope_lines(block: bytes, field: str, time_field: str | None) -> bytes:
    """Each line's ``field``, after its ``time_field`` (RFC 3339: read as a stamp), one line for
    one line (the numbers stay the file's); a line that is not such an object stays as it is."""
    text = block.decode("utf-8", "replace")
    ends = text.endswith("\n")
    raw = pl.Series("raw", (text[:-1] if ends else text).split("\n"), dtype=pl.String)
    # (an entry of several lines, a traceback Cloud Logging kept whole, is read as its lines:
    # the line numbers after it are then the lines read, not the file's)
    log = raw.str.json_path_match(f"$.{field}").str.strip_chars_end("\n")
    time = raw.str.json_path_match(f"$.{time_field}") if time_field else pl.Series(
        [None] * raw.len(), dtype=pl.String)
    lines = pl.select(
        pl.when(log.is_null()).then(raw)
        .when(time.is_null()).then(log)
        .otherwise(pl.concat_str([time, pl.lit(" "), log]))
    ).to_series()
    return ("\n".join(lines.to_list()) + ("\n" if ends else "")).encode("utf-8")


#: A terminal or a pane capture wraps every line longer than its width: the file's longest
#: lines are then all exactly that wide, and many are. Read from the file's first 64 kB (a
#: console wrapped by its terminal is so from its first screens; 1 MB cost 0.8 ms a file).
WRAP_SAMPLE = 64 << 10
#: How much of a file's start is looked at first (its line-start artifacts, its widest lines).
_PASTE_HEAD = 16 << 10
#: At least this many lines of the wrap width, and this share of the non-blank lines...
WRAP_MIN_LINES, WRAP_MIN_SHARE = 8, 0.02
#: ... and this many times as many as one character shorter (a natural end is no wall).
WRAP_WALL = 4
#: Most lines of the width go on on the next line (a share of them).
WRAP_GOES_ON = 0.6
#: A line wrapped over more physical lines than this is joined in parts.
WRAP_MAX_JOINED = 16


def wrap_width(first: bytes) -> int | None:
    """The width a terminal hard-wrapped the file at, or None: the longest lines all end at
    one column (at least 60) that far more lines reach than the column before it."""
    sample = first[:WRAP_SAMPLE]
    head = sample[:_PASTE_HEAD]
    if head.isascii():  # (most logs: the first 16 kB's widest lines and their count in C first)
        widths = list(map(len, head.replace(b"\r", b"").split(b"\n")))
        if len(first) > len(head):
            widths.pop()
        if not widths or max(widths) < 60 or widths.count(max(widths)) < WRAP_MIN_LINES // 2:
            return None
    text = sample.decode("utf-8", "replace")
    lines = text.split("\n")[:-1] if len(first) > WRAP_SAMPLE else text.split("\n")
    lengths = Counter(len(line.rstrip("\r")) for line in lines if line.strip())
    if not lengths:
        return None
    width = max(lengths)
    at = lengths[width]
    if width < 60 or at < WRAP_MIN_LINES or at < WRAP_MIN_SHARE * sum(lengths.values()) \
            or at < WRAP_WALL * max(1, lengths.get(width - 1, 0)):
        return None
    # (and most of them go on on the next line: not a template's lines of one length, nor
    # lines a paste cut at one column, each followed by a line of its own)
    walls = [(line, lines[i + 1]) for i, line in enumerate(lines[:-1])
             if len(line.rstrip("\r")) == width]
    if len({line for line, _ in walls}) < WRAP_MIN_LINES:
        return None  # one line repeated
    goes_on = sum(1 for line, after in walls if _goes_on(line, after))
    return width if goes_on >= WRAP_GOES_ON * len(walls) else None


def _goes_on(line: str, after: str) -> bool:
    """Whether ``after`` is the rest of ``line``, which a terminal wrapped: not a box's or a
    padded line (they end at the width on their own), not a line of its own after it, nor a
    table's next row, an indented line or a line that starts like ``line`` (a template's)."""
    line = line.rstrip("\r")
    return bool(after.strip()) and not line[-1:].isspace() and not after.startswith("  ") \
        and not _boxed(line) and _lead(after) != _lead(line) and not _starts_own(after)


def _lead(text: str) -> str:
    """A line's first characters, digits masked: two rows of one template start alike."""
    return re.sub(r"[0-9]", "#", text[:16])


def unwrapped_lines(block: bytes, width: int) -> bytes:
    """Each line exactly ``width`` wide joined with the lines it goes on on (at most
    WRAP_MAX_JOINED in all), the joined ones left blank: one line for one line, the numbers stay
    the file's. A next line with a prefix of its own (a stamp, a launcher's) starts a line."""
    lines = block.decode("utf-8", "replace").split("\n")
    i = 0
    while i < len(lines) - 1:
        n = 1
        while n < WRAP_MAX_JOINED and i + n < len(lines) and len(lines[i + n - 1].rstrip("\r")) == \
                width and _goes_on(lines[i + n - 1], lines[i + n]):
            n += 1
        if n > 1:
            lines[i] = "".join(line.rstrip("\r") for line in lines[i:i + n])
            lines[i + 1:i + n] = [""] * (n - 1)
        i += n
    return "\n".join(lines).encode("utf-8")


def _boxed(text: str) -> bool:
    """A line of a box drawn to a width (rich's tracebacks and tables): it ends there."""
    text = text.strip()
    return bool(text) and ("\u2500" <= text[0] <= "\u257f" or "\u2500" <= text[-1] <= "\u257f")


def _starts_own(text: str) -> bool:
    """Whether ``text`` starts a line of its own (a prefix, a stamp, a level, an NCCL line, a
    traceback's)."""
    info = parse_line(text, 2000)
    return info.body != text or info.ts is not None or info.level is not None \
        or info.pid is not None or bool(FRAME_LINE.match(text)) or text.startswith("Traceback")


def iter_blocks(fh: IO[bytes], display: str, notes: list[InputNote]) -> Iterator[bytes]:
    """UTF-8 bytes in blocks that end at a line end (the last one may not): NUL bytes dropped,
    UTF-16 re-encoded, over-long lines cut, binary files refused, log exports' JSON lines
    unwrapped, a terminal's hard wrap joined, each with a note."""
    first = fh.read(BLOCK_BYTES)
    envelope = json_envelope(first)
    if envelope is not None:
        name, field, time_field = envelope
        after = f", after its \"{time_field}\"" if time_field else ""
        notes.append(InputNote(display, f"{name}: each line's \"{field}\" field read{after}",
                               "info"))
        for block in _blocks(first, fh, display, notes):
            yield envelope_lines(block, field, time_field)
        return
    pasted = paste_fixes(first)
    if pasted is not None:
        notes.append(InputNote(display, f"copied through a web page, an editor or a pager: "
                                        f"{pasted.said}; read without them", "info"))
        blocks: Iterator[bytes] = map(pasted.apply, _blocks(first, fh, display, notes))
        first = pasted.apply(first)
    else:
        blocks = _blocks(first, fh, display, notes)
    width = wrap_width(first)
    if width is not None:
        notes.append(InputNote(display, f"hard-wrapped at {width} columns (a terminal's or a "
                                        f"pane capture's): each line {width} characters wide "
                                        "read together with the lines it goes on on", "info"))
        for block in blocks:
            yield unwrapped_lines(block, width)
        return
    yield from blocks


#: What copying a log through a web page, an editor or a pager leaves in it, and the bytes
#: that undo it: no-break and zero-width spaces, typographic quotes and dashes, HTML entities.
_TYPOGRAPHY: tuple[tuple[bytes, bytes], ...] = (
    ("\u00a0".encode(), b" "), ("\u202f".encode(), b" "), ("\u2007".encode(), b" "),
    ("\u200b".encode(), b""), ("\u200c".encode(), b""), ("\u200d".encode(), b""),
    ("\u201c".encode(), b'"'), ("\u201d".encode(), b'"'), ("\u2018".encode(), b"'"),
    ("\u2019".encode(), b"'"), ("\u2013".encode(), b"--"), ("\u2014".encode(), b"--"),
)
_ENTITIES: tuple[tuple[bytes, bytes], ...] = (
    (b"&lt;", b"<"), (b"&gt;", b">"), (b"&quot;", b'"'), (b"&#39;", b"'"), (b"&#x27;", b"'"),
    (b"&apos;", b"'"), (b"&amp;", b"&"),
)
#: A line number a pager or an editor put before each line: cat -n / nl ("     1\t"),
#: less -N ("      1 "), vim's :set number ("  1 "), a log viewer's ("1\t").
_NUMBERED = re.compile(rb"^ *([0-9]+)(?:\t| |\r?$)")
_NUMBERED_STRIP = re.compile(rb"(?m)^ *[0-9]+(?:\t| |(?=\r?$))")


#: What starts a line of a log, never a traceback's frame or a stack dump's: torch's, a
#: launcher's or an mpirun prefix, a stamp, a traceback's header, a glog header.
_LINE_START = re.compile(rb"Traceback \(most recent call last\)|\[(?:rank|default|[0-9]+[,\]])|"
                         rb"[0-9]{4}-[0-9]{2}-[0-9]{2}|[IWEF][0-9]{4} [0-9]{2}:")


@dataclass(frozen=True)
class PasteFixes:
    """The undoing of a file's paste artifacts, block by block (one line stays one line)."""

    replace: tuple[tuple[bytes, bytes], ...] = ()
    numbered: bool = False
    indent: int = 0
    bullet: bool = False
    said: str = ""

    def apply(self, block: bytes) -> bytes:
        for old, new in self.replace:
            if old in block:
                block = block.replace(old, new)
        if self.numbered:
            block = _NUMBERED_STRIP.sub(b"", block)
        if self.indent:
            block = re.sub(rb"(?m)^ {%d}" % self.indent, b"", block)
        if self.bullet:
            block = re.sub(rb"(?m)^[-*] ", b"", block)
        return block


def paste_fixes(first: bytes) -> PasteFixes | None:
    """What the file's first 64 kB show of paste artifacts: typography (any), entities (a
    "&lt;module&gt;" or "&quot;"), every line numbered in order by a pager or an editor, or every
    line indented alike (a Markdown code block); None when nothing."""
    sample = first[:WRAP_SAMPLE]
    replace = () if sample.isascii() else tuple(p for p in _TYPOGRAPHY if p[0] in sample)
    if b"&" in sample and (b"&lt;module&gt;" in sample or b"&quot;" in sample
                           or b"&#39;" in sample or (b"&gt;" in sample and b"&lt;" in sample)):
        replace += _ENTITIES
    # (the line-start artifacts, looked at only where the first lines can show one: counted
    # in C, most logs stop here)
    head = sample[:_PASTE_HEAD]
    firsts = [line[:1] for line in head.split(b"\n", 12)[:12] if line.strip()]
    if sum(c.isdigit() or c in (b" ", b"-", b"*") for c in firsts) < 0.5 * len(firsts):
        return _paste_fixes(replace, False, 0, False)
    lines = [line.rstrip(b"\r") for line in head.split(b"\n")[:200] if line.strip()]
    numbers = [m for m in map(_NUMBERED.match, lines) if m is not None]
    numbered = len(lines) >= 5 and len(numbers) == len(lines) and sum(
        int(b.group(1)) == int(a.group(1)) + 1 for a, b in itertools.pairwise(numbers)
    ) >= 0.8 * (len(numbers) - 1)
    indent, bullet = 0, False
    if not numbered and len(lines) >= 5:
        # (a Markdown code block: most lines indented alike, prose around it not)
        indents = [len(line) - len(line.lstrip(b" ")) for line in lines]
        least = min((i for i in indents if i >= 2), default=0)
        if 2 <= least <= 8 and sum(i >= least for i in indents) >= 0.8 * len(lines) and any(
                i == least and _LINE_START.match(line, i) for i, line in zip(indents, lines,
                                                                             strict=True)):
            indent = least  # (and a line that starts a log's lines is among the least indented)
        bullet = sum(line[:2] in (b"- ", b"* ") for line in lines) >= 0.9 * len(lines)
    return _paste_fixes(replace, numbered, indent, bullet)


def _paste_fixes(replace: tuple[tuple[bytes, bytes], ...], numbered: bool, indent: int,
                 bullet: bool) -> PasteFixes | None:
    if not (replace or numbered or indent or bullet):
        return None
    said = "; ".join(x for x in (
        "typographic spaces, quotes or dashes" if any(p in _TYPOGRAPHY for p in replace) else "",
        "HTML entities" if any(p in _ENTITIES for p in replace) else "",
        "a line number before each line" if numbered else "",
        f"lines indented by {indent} spaces" if indent else "",
        "a list marker before each line" if bullet else "") if x)
    return PasteFixes(replace, numbered, indent, bullet, said)


def _blocks(first: bytes, fh: IO[bytes], display: str, notes: list[InputNote]) -> Iterator[bytes]:
    decoder = None
    if first[:2] in (b"\xff\xfe", b"\xfe\xff"):
        decoder = codecs.getincrementaldecoder("utf-16")(errors="replace")
    elif b"\x00" in first[:65536] and _looks_binary(first[:65536]):
        notes.append(InputNote(display, "binary file (NUL bytes), not read as a log", "info"))
        return
    elif first.startswith(codecs.BOM_UTF8):
        first = first[3:]
    carry = b""
    nul_noted = long_noted = False
    chunk = first
    while chunk:
        if decoder is not None:
            chunk = decoder.decode(chunk).encode("utf-8")
        if b"\x00" in chunk:
            chunk = chunk.replace(b"\x00", b"")
            if not nul_noted:
                notes.append(InputNote(display, "NUL bytes dropped (a hole left by a truncated "
                                                "or preallocated log file?)", "info"))
                nul_noted = True
        cut = chunk.rfind(b"\n")
        if cut < 0:
            carry += chunk
            if len(carry) > LONG_LINE:
                carry = carry[:LONG_LINE_KEEP] + b"\r" + carry[-LONG_LINE_KEEP:]
                if not long_noted:
                    notes.append(InputNote(display, f"a line longer than {LONG_LINE >> 20} MB was "
                                                    "cut to its first and last MB", "info"))
                    long_noted = True
        else:
            # The pending line and the chunk's lines in one block, one copy (as a slice makes):
            # the pending line alone made every other block of a large file one line, which
            # cost as much polars and pool work as a full one (1 GB: 250 such blocks).
            block = b"".join((carry, memoryview(chunk)[: cut + 1])) if carry else \
                chunk if cut == len(chunk) - 1 else chunk[: cut + 1]
            carry, chunk = chunk[cut + 1 :], b""  # (the chunk not held while the block waits)
            yield block
            block = b""
        chunk = fh.read(min(NEXT_BYTES, BLOCK_BYTES))
    if carry:
        yield carry


def prefetched(items: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """Run ``items`` on a reader thread (reads and decompression release the GIL), ``depth``
    blocks ahead; its exceptions surface here after the blocks read before them."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(depth)
    stop = threading.Event()

    def put(tag: str, value: Any) -> bool:
        """Hand over unless the consumer went away (then never block on a full queue)."""
        while not stop.is_set():
            try:
                q.put((tag, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    slots = threading.Semaphore(depth)

    def produce() -> None:
        try:
            while True:  # the next block read once a slot is free: none held waiting for one
                while not slots.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                item = next(items, None)
                if item is None:
                    break
                if not put("item", item):
                    return
            put("end", None)
        except BaseException as err:  # handed to the consumer, which re-raises it
            put("error", err)

    thread = threading.Thread(target=produce, name="ddp-autopsy-reader", daemon=True)
    thread.start()
    try:
        while True:
            tag, value = q.get()
            slots.release()
            if tag == "end":
                return
            if tag == "error":
                raise value
            yield value
    finally:
        stop.set()
        thread.join()


@dataclass
class _Sifted:
    """One block after the vectorised pre-filter: what Python still has to read."""

    #: line (0-based in the block), text; None for a block :func:`_sift_quick` read without
    #: polars (then ``lines``, ``rows`` and ``after`` say what Python reads of it).
    frame: pl.DataFrame | None
    candidates: pl.DataFrame | None
    prefix: FilePrefix | None  # decided on a file's first block
    replaced: bool
    opens: bool = False  # a failure summary opens here: its context lines are in candidates
    tails: list[tuple[int, str, str]] = field(default_factory=list)  # see _tails
    #: ``line`` of the block's first line in ``frame`` and ``candidates`` (a file sifted in a
    #: batch of files: its frame is a slice of the batch's, numbered from the batch's start).
    base: int = 0
    #: The needles on each candidate line, by ``line``, when Hyperscan found them.
    found: dict[int, frozenset[str]] | None = None
    #: Each candidate (line, text, needles): listed on the pool's thread, where its polars
    #: calls do not wait behind other blocks' (a call from the caller's thread queued for
    #: ~1 ms behind the pool's work, per file).
    rows: list[tuple[int, str, frozenset[str]]] = field(default_factory=list)
    #: The number of lines in the block.
    lines: int = 0
    #: Without a frame: the lines after each candidate (by 0-based index in the block, at most
    #: MAX_JOINED - 1 of them), which a hard-wrapped message may go on on.
    after: dict[int, str] | None = None

    def __post_init__(self) -> None:
        if self.frame is not None:
            self.lines = self.frame.height
            self.rows = list(_found(self.candidates, self.found))  # type: ignore[arg-type]

    def following(self, start: int, n: int) -> list[str]:
        """The text of the block's lines ``start`` to ``start + n`` (0-based, fewer at its end)."""
        if self.frame is not None:
            return self.frame["text"][start: start + n].to_list()
        after = self.after or {}
        return [after[i] for i in range(start, min(start + n, self.lines))]


@dataclass
class _Scanned:
    """A file's events, classified where it was sifted, for the context ``ctx`` (as
    :func:`scan_text` leaves it): its caller uses them if it gives an equal context, else
    reads the file again (``again``). Its lines are not kept: a batch's memory is freed as soon
    as it is classified, not when the caller takes its last file."""

    ctx: FileContext
    rows: list[dict[str, Any]]
    notes: list[InputNote]
    stats: ScanStats
    again: Callable[[], tuple[int, _Sifted] | None]


#: polars decompresses bytes that start like gzip, zlib or zstd: a block of text that starts so
#: ("x^2 ..." is a zlib header) would be lost; it is read behind a newline, dropped after.
_SNIFFED = (b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"x\x01", b"x^", b"x\x9c", b"x\xda")


class _NeedsPolars(Exception):
    """Raised in a worker process (see :class:`Presifter`) where a file would need polars."""


#: Set in worker processes: polars' thread pools do not survive a fork.
_no_polars = False


def _read_lines(block: bytes) -> tuple[pl.DataFrame, bool]:
    """A block's lines as ``line`` (0-based), ``text``; whether bad UTF-8 was replaced."""
    if _no_polars:
        raise _NeedsPolars
    if block.startswith(_SNIFFED):
        frame, replaced = _read_lines(b"\n" + block)
        return frame.slice(1).with_columns(pl.col("line") - 1), replaced
    try:
        return pl.read_lines(block, name="text", row_index_name="line"), False
    except pl.exceptions.ComputeError:  # invalid UTF-8: replace the bad bytes
        return pl.read_lines(block.decode("utf-8", "replace").encode(), name="text",
                             row_index_name="line"), True


def _lines(block: bytes) -> tuple[pl.DataFrame, bool]:
    """A block's lines (see :func:`_read_lines`), ANSI escapes stripped (a CRLF ending's "\\r" is
    left to the lines read in Python: stripped, or split at by :func:`lines.segments`)."""
    frame, replaced = _read_lines(block)
    if b"\x1b" in block:
        frame = frame.with_columns(pl.col("text").str.replace_all(ANSI, ""))
    if has_box(block):  # rich's boxed tracebacks, read as plain ones
        frame = unbox(frame)
    return frame, replaced


#: A file's prefixes are decided on its first lines, at most this many bytes of them.
HEAD_BYTES = 1 << 19


def _head(block: bytes) -> tuple[FilePrefix, WriterKey | None]:
    """The prefixes and writer names of a file, from the first lines of its first block."""
    cut = block.find(b"\n", HEAD_BYTES)
    return detect(_lines(block if cut < 0 else block[: cut + 1])[0]["text"])


def _sift(block: bytes, head: bool, known: FilePrefix | None = None,
          writers: WriterKey | None = None) -> _Sifted:
    """Split a block into lines and keep the candidates and each writer's last line (polars,
    off the GIL; few calls, as each costs a fixed ~0.2 ms that thousands of small files add
    up). The file's first lines decide its prefixes (``known``, found here when None) and how
    to name its writers (``writers``), which a later block decides for itself if they did not."""
    if head and known is None and (quick := _sift_quick(block)) is not None:
        return quick
    frame, replaced = _lines(block)
    cands, found, prefixed = _candidates(frame, block, replaced, probe=known is None)
    if known is None:  # the common file has no prefixes: one query says so
        if prefixed is None:
            prefixed = frame.head(SAMPLE_LINES).select(
                pl.col("text").str.contains(ANY_PREFIX).any()).item()
        known, writers = detect(frame["text"]) if prefixed else (NO_PREFIX, None)
    elif writers is None and not head:  # no writer named in the file's first lines: here?
        writers = block_writers(frame["text"], known)
    prefix = known if head else None
    opens = False
    if cands.height:
        opens = any(o in text for text in cands["text"] for o in OPENERS)
        if opens:
            cands = _with_context(cands, frame)
    return _Sifted(frame, cands, prefix, replaced, opens,
                   _tails(frame, writers, named=names_ranks(block)), found=found)


def _candidates(frame: pl.DataFrame, block: bytes, replaced: bool, probe: bool = False
                ) -> tuple[pl.DataFrame, dict[int, frozenset[str]] | None, bool | None]:
    """The lines of ``frame`` (``block`` split by :func:`_lines`) that hold a needle: found
    by Hyperscan in the block's bytes when it is installed and the lines are the block's bytes
    as they are (no bad UTF-8 replaced, no ANSI stripped), else by polars' two-level filter;
    from Hyperscan, the needles on each, and (``probe``) whether the first SAMPLE_LINES lines
    show a prefix, in the query that numbers the lines (else None: not looked at)."""
    if _use_hyperscan(block, replaced):
        hs = _needle_lines(block, frame, probe=probe)
        if hs is not None:
            return _rows(frame, hs[0]), dict(zip(hs[0], hs[2], strict=True)), hs[3]
    if len(block) <= TINY_BLOCK:  # a few lines: the same test without compiling the filters
        return _rows(frame, [i for i, text in enumerate(frame["text"].to_list())
                             if any(n in text for n in NEEDLES)]), None, None
    _, first, second = _prefilter()
    cands = frame.filter(first)
    return (cands.filter(second) if cands.height else cands), None, None


#: Up to this many bytes, a block's lines are tested for each needle in Python: polars' filters
#: compile their regexes on first use (~10 ms, a quarter of a 10-line analyze's own work).
TINY_BLOCK = 4 << 10


def _rows(frame: pl.DataFrame, rows: list[int]) -> pl.DataFrame:
    return frame[rows] if rows else frame.clear()


def _use_hyperscan(block: bytes, replaced: bool) -> bool:
    """Whether the lines polars read are the block's bytes as they are (no bad UTF-8 replaced,
    no ANSI stripped) and the block is worth a Hyperscan pass."""
    return not replaced and len(block) >= HYPERSCAN_MIN and b"\x1b" not in block \
        and not has_box(block)


# --- Hyperscan: the needles in one pass over the bytes (optional: ``ddp-autopsy[fast]``) ------

#: Below this many bytes, polars' filter (no database to compile: ~0.05 s once).
HYPERSCAN_MIN = 256 << 10
_hs: Any = None  # the module, False when it cannot be used
_hs_db: Any = None
_hs_local = threading.local()
_hs_lock = threading.Lock()


#: Lines that ``lines.ANY_PREFIX`` may match: all but the empty ones and those that open with
#: a letter whose run of ``[A-Za-z0-9_.-]`` is followed by ":" and then not by a space (NCCL's
#: "host:pid:tid [3] NCCL INFO ..."), which no prefix can open: a file prefix's word is that run
#: followed by ": " or " ", a stamp, a quote, a pytest "E" or a line prefix opens otherwise.
#: Its first match in a file's first HEAD_BYTES is all :func:`_sift_quick` needs (a Hyperscan
#: pass of its own, stopped there; ``tests/test_perf_quick.py`` checks it against ANY_PREFIX).
MAYBE_PREFIXED = rb"^(?:[^A-Za-z\n]|[A-Za-z][A-Za-z0-9_.-]*(?:[^A-Za-z0-9_.:\n-]|: |:?$))"
#: Hyperscan ids: the needles' are their index in NEEDLES; then those of _SELF_OPENERS (a line
#: that opens with its rank, see :func:`names_ranks`).
_OPENER_ID = len(NEEDLES)
_hs_maybe: Any = None  # MAYBE_PREFIXED's database
_hs_prefix: Any = None  # ANY_PREFIX's, for worker processes (see _prefixed_head)


def _hyperscan() -> Any:
    """The compiled needle database, or None (Hyperscan not installed, or it failed)."""
    global _hs, _hs_db, _hs_maybe, _hs_prefix
    if _hs is None:
        with _hs_lock:
            if _hs is None:
                try:
                    import hyperscan

                    exprs = [re.escape(n).encode() for n in NEEDLES]
                    exprs += [rb"\n" + o[1:] for o in _SELF_OPENERS]
                    db, maybe, prefix = _cached_databases(hyperscan, exprs) or \
                        _compiled_databases(hyperscan, exprs)
                    _hs, _hs_db, _hs_maybe, _hs_prefix = hyperscan, db, maybe, prefix
                except Exception:  # not installed, or no wheel for this CPU: polars does it
                    _hs = False
    return _hs_db if _hs else None


def _compiled_databases(hyperscan: Any, exprs: list[bytes]) -> tuple[Any, Any, Any]:
    """The needles' database (``exprs``), MAYBE_PREFIXED's and ANY_PREFIX's, compiled
    (~90 ms) and saved for the next run (:func:`_cached_databases`)."""
    # (as regexes: compiled faster than as literals, 28 against 40 ms)
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs))
    lines_dbs: list[Any] = []
    for rx in (MAYBE_PREFIXED, ANY_PREFIX.encode()):
        lines_dbs.append(hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK))
        try:
            lines_dbs[-1].compile(expressions=[rx], ids=[0], elements=1,
                                  flags=hyperscan.HS_FLAG_MULTILINE)
        except hyperscan.error:
            if rx == MAYBE_PREFIXED:
                raise
            lines_dbs[-1] = None  # (lines.py's regex grew what Hyperscan lacks: no workers)
    path = _hs_cache_path(hyperscan, exprs)
    if path is not None and lines_dbs[-1] is not None:
        with suppress(OSError):
            data = b"".join(len(d).to_bytes(8, "little") + d
                            for d in map(hyperscan.dumpb, (db, *lines_dbs)))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # (whole or not at all, whoever writes it at once)
    return db, lines_dbs[0], lines_dbs[1]


def _hs_cache_path(hyperscan: Any, exprs: list[bytes]) -> Path | None:
    """Where the compiled databases are kept: the user's cache directory, named by what they
    were compiled from (``DDP_AUTOPSY_CACHE=0``: not kept)."""
    if os.environ.get("DDP_AUTOPSY_CACHE", "") == "0":
        return None
    import hashlib
    import platform

    key = hashlib.sha256(b"\0".join([*exprs, MAYBE_PREFIXED, ANY_PREFIX.encode(), getattr(
        hyperscan, "__version__", "").encode(), platform.machine().encode()])).hexdigest()[:20]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "ddp-autopsy", f"hyperscan-{key}.db")


def _cached_databases(hyperscan: Any, exprs: list[bytes]) -> tuple[Any, Any, Any] | None:
    """The databases a run before compiled for the same needles (read in ~0.1 ms), if test
    scans find what they must (else, or unreadable: None, compiled anew): the needles on a
    line of them all, MAYBE_PREFIXED and ANY_PREFIX on a line they open."""
    path = _hs_cache_path(hyperscan, exprs)
    if path is None:
        return None
    try:
        data = path.read_bytes()
        dbs = []
        at = 0
        for _ in range(3):
            size = int.from_bytes(data[at:at + 8], "little")
            dbs.append(hyperscan.loadb(data[at + 8:at + 8 + size], hyperscan.HS_MODE_BLOCK))
            at += 8 + size
        probe = b"\n".join(n.encode() for n in NEEDLES)
        found: set[int] = set()
        dbs[0].scan(probe, match_event_handler=lambda id_, *_: found.add(id_)
                    if id_ < len(exprs) else None, scratch=hyperscan.Scratch(dbs[0]))
        hits: set[int] = set()
        for i, db in enumerate(dbs[1:]):
            db.scan(b"x\n[rank0]: y\n", match_event_handler=lambda *_, i=i: hits.add(i),
                    scratch=hyperscan.Scratch(db))
    except Exception:  # absent, cut short, corrupt, or made for another CPU
        return None
    return (dbs[0], dbs[1], dbs[2]) if found >= set(range(len(NEEDLES))) and len(hits) == 2 \
        and at == len(data) else None


#: The catalog's needle (in ``_BY_NEEDLE``) of each Hyperscan id, else None.
_ID_NEEDLE = [n if n in _BY_NEEDLE else None for n in NEEDLES]


def _needle_lines(block: bytes, frame: pl.DataFrame, marks: Collection[int] = (),
                  probe: bool = False
                  ) -> tuple[list[int], list[int], list[frozenset[str]], bool | None] | None:
    """The 0-based numbers of the lines of ``block`` that hold a needle, the number of lines
    before each byte offset of ``marks`` (ascending), the catalog's needles on each line
    found (all of them: Hyperscan reports every match, overlapping ones too), and with
    ``probe`` whether the first SAMPLE_LINES lines show a prefix (None: not looked at). None:
    no Hyperscan, or the block's lines are not ``frame``'s lines ended by newlines."""
    db = _hyperscan()
    if db is None:
        return None
    scratch = getattr(_hs_local, "scratch", None)
    if scratch is None:  # one per thread: scans run on the pool's threads at once
        scratch = _hs_local.scratch = _hs.Scratch(db)
    ends: list[tuple[int, int]] = []
    db.scan(block, match_event_handler=lambda id_, _start, end, _flags, _ctx:
            ends.append((end, id_)) if id_ < _OPENER_ID else None, scratch=scratch)
    # Match ends as (offset, id), marks as (offset, MARK): a mark at a match's end comes after
    # it. Matches come in no promised order.
    points = sorted([*ends, *((m, MARK) for m in marks)])
    numbers, prefixed = _lines_before(block, frame, [offset for offset, _ in points], probe)
    if numbers is None:
        return None
    found: list[int] = []
    marked: list[int] = []
    needles: list[set[str]] = []
    for (_, id_), line in zip(points, numbers, strict=True):
        if id_ == MARK:
            marked.append(line)
            continue
        if not found or found[-1] != line:
            found.append(line)
            needles.append(set())
        if (needle := _ID_NEEDLE[id_]) is not None:
            needles[-1].add(needle)
    return found, marked, [frozenset(n) for n in needles], prefixed


def _scratch(maybe: bool | str = False) -> Any:
    """This thread's Hyperscan scratch space (scans run on the pool's threads at once), for the
    needles' database, MAYBE_PREFIXED's (``maybe``) or ANY_PREFIX's (``"prefix"``)."""
    name = maybe if isinstance(maybe, str) else "maybe" if maybe else "scratch"
    scratch = getattr(_hs_local, name, None)
    if scratch is None:
        scratch = _hs.Scratch({"maybe": _hs_maybe, "prefix": _hs_prefix}.get(name, _hs_db))
        setattr(_hs_local, name, scratch)
    return scratch


def _first_maybe(block: bytes) -> int | None:
    """Where the first line MAYBE_PREFIXED matches in the first HEAD_BYTES of ``block`` ends."""
    found: list[int] = []

    def stop(_id: int, _start: int, end: int, _flags: int, _ctx: Any) -> bool:
        found.append(end)
        return True  # the first is enough

    with suppress(_hs.ScanTerminated):
        _hs_maybe.scan(memoryview(block)[:HEAD_BYTES], match_event_handler=stop,
                       scratch=_scratch(True))
    return found[0] if found else None


#: Blocks of at least this many bytes are worth :func:`_sift_quick` (and a file this large is
#: sifted alone, not in a batch of small files).
QUICK_MIN = 256 << 10


def _sift_quick(block: bytes) -> _Sifted | None:
    """A file's first block sifted without polars, when it is the common one: ASCII, no CR,
    no ANSI escape, no prefix on its first SAMPLE_LINES lines, no failure summary. One
    Hyperscan pass finds the needles, the first line a prefix may open (MAYBE_PREFIXED) and the
    lines that open with their rank; line numbers are newlines counted in the bytes; only the
    candidates, the lines after them and the last lines are cut out and decoded. None: sift it
    with polars (:func:`_sift`), which gives the same for every block this takes."""
    if len(block) < max(QUICK_MIN, HYPERSCAN_MIN) or not block.isascii() or b"\r" in block \
            or b"\x1b" in block:  # (ASCII: no box, no bad UTF-8)
        return None
    db = _hyperscan()  # (not before: a small file needs no Hyperscan, ~50 ms and 30 MB)
    if db is None:
        return None
    maybe = _first_maybe(block)
    if _no_polars and maybe is not None and _prefixed_head(block):
        return None  # (in a worker, before the needles' scan: the parent reads it)
    ends: list[tuple[int, int]] = []
    other: list[tuple[int, int]] = []
    db.scan(block, match_event_handler=lambda id_, _start, end, _flags, _ctx:
            (ends if id_ < _OPENER_ID else other).append((end, id_)), scratch=_scratch())
    ends.sort()
    size = len(block)
    # The head's newlines counted up to HEAD_BYTES: the first SAMPLE_LINES lines must end
    # there (else a prefix could open beyond what the scan looked at for MAYBE_PREFIXED).
    marks = sorted({end for end, _ in ends} | {min(size, HEAD_BYTES)}
                   | ({maybe} if maybe is not None else set()))
    *counts, newlines = _newlines_before(block, marks)
    before = dict(zip(marks, counts, strict=True))
    total = newlines + (not block.endswith(b"\n"))
    if before[min(size, HEAD_BYTES)] < min(SAMPLE_LINES, total) and size > HEAD_BYTES:
        return None  # long lines: the first SAMPLE_LINES go on past HEAD_BYTES
    if maybe is not None and before[maybe] < SAMPLE_LINES and not _no_polars \
            and _probe_head(block):
        return None  # prefixes: lines.detect on polars' lines
    rows: list[tuple[int, str, frozenset[str]]] = []
    after: dict[int, str] = {}
    found: dict[int, frozenset[str]] = {}
    for line, group in itertools.groupby(ends, key=lambda e: before[e[0]]):
        group = list(group)
        start = block.rfind(b"\n", 0, group[0][0]) + 1
        stop = block.find(b"\n", group[0][0])
        stop = size if stop < 0 else stop
        text = block[start:stop].decode()
        if any(o in text for o in OPENERS):
            return None  # a failure summary: its context lines are looked for in polars
        needles = frozenset(n for _, id_ in group if (n := _ID_NEEDLE[id_]) is not None)
        rows.append((line, text, needles))
        found[line] = needles
        for k in range(1, MAX_JOINED):  # what a hard-wrapped message may go on on
            if line + k >= total:
                break
            start = stop + 1
            stop = block.find(b"\n", start)
            stop = size if stop < 0 else stop
            after[line + k] = block[start:stop].decode()
    tails = _last_nonblank(block, total)
    if tails is None:
        return None
    if any(end - len(_SELF_OPENERS[id_ - _OPENER_ID]) >= size - _SELF_BYTES
           for end, id_ in other) or block[:4].lower() in (b"rank", b"glob") \
            or _stamped_self(block, max(0, size - _SELF_BYTES)):
        tails += _self_named_bytes(block, total)  # names_ranks(block)
    return _Sifted(None, None, NO_PREFIX, False, False, tails, found=found, rows=rows,
                   lines=total, after=after)


_np: Any = None  # numpy once imported, False without it
#: Blocks counted by ``bytes.count`` before numpy is imported (~0.07 s, paid back after ~350
#: blocks of 0.8 MB; from the first when the Presifter is given this many large files).
NUMPY_AFTER = 256
_counted = 0


def _newlines_before(block: bytes, offsets: list[int]) -> list[int]:
    """The newlines of ``block`` before each of ``offsets`` (ascending), and in all of it
    last: by numpy when it is installed (0.1 ms a 0.8 MB file, off the GIL, where
    ``bytes.count`` takes 0.25-0.4 ms holding it), from the NUMPY_AFTER-th block on."""
    global _np, _counted
    if _np is None and _counted >= NUMPY_AFTER:
        try:
            import numpy

            _np = numpy
        except ImportError:
            _np = False
    out = []
    pos = count = 0
    if _np:
        newline = _np.frombuffer(block, _np.uint8) == 10  # (one pass, then counts of bools)
        for offset in [*offsets, len(block)]:
            count += int(_np.count_nonzero(newline[pos:offset]))
            pos = offset
            out.append(count)
        return out
    _counted += 1
    for offset in [*offsets, len(block)]:
        count += block.count(b"\n", pos, offset)
        pos = offset
        out.append(count)
    return out


def _probe_head(block: bytes) -> bool:
    """Whether any of the first SAMPLE_LINES lines of ``block`` shows a prefix (polars' regex
    on the lines of its first HEAD_BYTES, as :func:`_sift` asks)."""
    cut = block.find(b"\n", HEAD_BYTES)
    frame = _read_lines(block if cut < 0 else block[: cut + 1])[0]
    if frame.height < SAMPLE_LINES and cut >= 0:
        frame = _read_lines(block)[0]
    return frame.select(_probe()).item()


def _prefixed_head(block: bytes) -> bool:
    """:func:`_probe_head` without polars (in a worker process): ANY_PREFIX by Hyperscan over
    the first SAMPLE_LINES lines, stopped at its first match. It may say yes where polars says
    no (a match that runs over a newline, which no line of polars' holds): the file is then read
    in the parent; it says no only where polars does."""
    end = _sample_end(block)
    found: list[int] = []

    def stop(_id: int, _start: int, _end: int, _flags: int, _ctx: Any) -> bool:
        found.append(_end)
        return True

    with suppress(_hs.ScanTerminated):
        _hs_prefix.scan(memoryview(block)[:end], match_event_handler=stop,
                        scratch=_scratch("prefix"))
    return bool(found)


def _sample_end(block: bytes) -> int:
    """The offset after the first SAMPLE_LINES lines of ``block`` (its size when it has fewer):
    by numpy when imported and they end within HEAD_BYTES (0.03-0.09 ms a 0.8 MB file, where
    ``bytes.find`` line after line takes 0.25 ms)."""
    if _np:
        ends = _np.flatnonzero(_np.frombuffer(block, _np.uint8, min(len(block), HEAD_BYTES))
                               == 10)
        if len(ends) >= SAMPLE_LINES:
            return int(ends[SAMPLE_LINES - 1]) + 1
        if len(block) <= HEAD_BYTES:
            return len(block)
    end = 0
    for _ in range(SAMPLE_LINES):
        end = block.find(b"\n", end) + 1
        if not end:
            return len(block)
    return end


def _line_ends(block: bytes, total: int) -> Iterator[tuple[int, int, int]]:
    """The lines of ``block`` from its last: (0-based index, start, end) offsets."""
    end = len(block) - 1 if block.endswith(b"\n") else len(block)
    for i in range(total - 1, -1, -1):
        start = block.rfind(b"\n", 0, end) + 1
        yield i, start, end
        end = start - 1


def _last_nonblank(block: bytes, total: int) -> list[tuple[int, str, str]] | None:
    """:func:`_last_unprefixed` in the bytes (None: none in the last TAIL_LOOKBACK lines)."""
    for n, (i, start, end) in enumerate(_line_ends(block, total)):
        if n >= TAIL_LOOKBACK:
            return None  # (rare: left to polars)
        if block[start:end].strip(_BLANK_BYTES):
            return [(i, block[start:end].decode(), "")]
    return []


def _self_named_bytes(block: bytes, total: int) -> list[tuple[int, str, str]]:
    """:func:`_self_named` in the bytes."""
    last: dict[str, tuple[int, str]] = {}
    for n, (i, start, end) in enumerate(_line_ends(block, total)):
        if n >= SELF_LOOKBACK:
            break
        head = block[start:start + 2]
        if head in _SELF_PAIRS_BYTES or head[:1].isdigit() or head[:1] == b"[" \
                or head[:1].isupper():
            text = block[start:end].decode(errors="replace")
            m = self_rank(text)
            if m is not None and m.group(1) not in last:  # (from the end: the first is the last)
                last[m.group(1)] = (i, text)
    return [(i, text, f"rank {k}") for k, (i, text) in
            sorted(last.items(), key=lambda kv: kv[1][0]) if text]


@functools.cache
def _probe() -> pl.Expr:
    """Whether a block's first lines show a prefix (``lines.detect`` looks further only then)."""
    return pl.col("text").head(SAMPLE_LINES).str.contains(ANY_PREFIX).any().alias("prefixed")


def _lines_before(block: bytes, frame: pl.DataFrame, offsets: list[int], probe: bool = False
                  ) -> tuple[list[int] | None, bool | None]:
    """For each byte offset of ``block`` (ascending), the newlines before it, None when the
    frame's lines, each ended by a newline, are not the block's bytes; with ``probe``, in the
    same query (-0.1 to -0.3 ms a 0.8 MB file against a query of its own), whether the first
    SAMPLE_LINES lines show a prefix (else None)."""
    if b"\r" not in block:  # then the frame's lines are the bytes between newlines
        if not offsets and not probe:
            return [], None
        # One query (each costs a fixed ~0.1 ms): ends[i], the offset after line i's newline;
        # the lines ended before offset o are those with ends <= o.
        size = pl.col("text").str.len_bytes().cast(pl.Int64) + 1
        got = frame.select(size.sum().alias("size"), size.cum_sum().search_sorted(
            pl.Series(offsets, dtype=pl.Int64), side="right").implode().alias("lines"),
            *((_probe(),) if probe else ())).row(0)
        if got[0] != len(block) + (not block.endswith(b"\n")):
            return None, None
        return got[1], (got[2] if probe else None)
    # CRLF: read_lines dropped a "\r" before newlines; count them in the bytes.
    numbers = []
    pos = line = 0
    for offset in offsets:
        line += block.count(b"\n", pos, offset)
        pos = offset
        numbers.append(line)
    if line + block.count(b"\n", pos) + (not block.endswith(b"\n")) != frame.height:
        return None, None
    return numbers, None


MARK = 1 << 62  # sorts after every match id at the same offset


#: What a blank line holds (the same as ``lines.WriterKey``'s regexes).
BLANK = " \t\r"
_BLANK_BYTES = BLANK.encode()
#: Lines looked at from a block's end for its last non-blank one, in a file of one writer name.
TAIL_LOOKBACK = 64
#: A block's lines are named by their first characters (``WriterKey.quick``), by their exact
#: writer prefixes when that leaves more than this many names (many unprefixed lines).
QUICK_TAILS = 512


def _tails(frame: pl.DataFrame, writers: WriterKey | None, base: int = 0,
           named: bool = True) -> list[tuple[int, str, str]]:
    """The last non-blank line of each writer name in ``frame``: (line 0-based in the block,
    text, name), in line order (``base``: the block's first ``line`` in ``frame``; ``named``:
    the block may hold lines that open with their rank, :func:`names_ranks`)."""
    if writers is None:  # one name: the block's last non-blank line
        return _last_unprefixed(frame, base) + (_self_named(frame, base) if named else [])
    if writers.width is not None:
        tails = _last_of_each(frame, writers.quick())
        if tails.height <= QUICK_TAILS:
            # Empty lines are dropped here: their name "" by first characters is no other line's.
            return [(i - base, text, key) for i, text, key in tails.rows() if text]
    return [(i - base, text, key) for i, text, key in _last_of_each(frame, writers.exact()).rows()]


def _last_unprefixed(frame: pl.DataFrame, base: int) -> list[tuple[int, str, str]]:
    text = frame["text"]
    for i in range(text.len() - 1, max(-1, text.len() - 1 - TAIL_LOOKBACK), -1):
        if (value := text[i]) and value.strip(BLANK):
            return [(i, value, "")]
    if text.len() <= TAIL_LOOKBACK:
        return []
    return [(i - base, value, "") for i, value in
            frame.filter(pl.col("text").str.contains(r"[^ \t\r]")).tail(1).iter_rows()]


#: How far back from a block's end the lines that open with their rank are looked for.
SELF_LOOKBACK = 1024


#: Line starts of a line that opens with its rank (SELF_RANK), as bytes: a quick test of a
#: block's end before any per-line work (most files have none).
_SELF_OPENERS = (b"\nrank", b"\nRank", b"\nRANK", b"\nglobal")
#: How far from a block's end :func:`names_ranks` looks (bytes.find: no copy, no per-line work).
_SELF_BYTES = 64 << 10


def names_ranks(data: bytes) -> bool:
    """Whether the end of ``data`` may hold a line that opens with its rank (after a stamp,
    perhaps)."""
    start = max(0, len(data) - _SELF_BYTES)
    return any(data.find(o, start) >= 0 for o in _SELF_OPENERS) \
        or data[:4].lower() in (b"rank", b"glob") or _stamped_self(data, start)


def _self_named(frame: pl.DataFrame, base: int) -> list[tuple[int, str, str]]:
    """The last line of each rank among the block's final lines that open with their rank
    (``SELF_RANK``): in a console no launcher prefixed, what each rank was doing last."""
    # Eager queries, the last of each in Python: a lazy query's fixed cost was 0.3 ms a file;
    # the regex only on lines whose first two characters can start it (0.45 -> 0.32 ms).
    key, start = _self_exprs()
    tail = frame.tail(SELF_LOOKBACK).filter(start)
    if not tail.height:
        return []
    hits = tail.select("line", "text", key).filter(pl.col("key").is_not_null())
    last = {k: (i, text) for i, text, k in hits.rows()}
    return [(i - base, text, f"rank {k}") for k, (i, text) in
            sorted(last.items(), key=lambda kv: kv[1][0]) if text]


def _last_of_each(frame: pl.DataFrame, key: pl.Expr) -> pl.DataFrame:
    return (frame.lazy().with_columns(key.alias("key"))
            .filter(pl.col("key").is_not_null() & pl.col("key").is_last_distinct())
            .select("line", "text", "key").collect())


def _with_context(cands: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([cands, frame.filter(_context())]).unique("line").sort("line")


#: Blocks sifted at once: polars releases the GIL, so they run on all cores.
WORKERS = max(1, min(4, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _sifted(fh: IO[bytes], display: str, notes: list[InputNote]
            ) -> Iterator[tuple[int, _Sifted]]:
    """Sift a source's blocks and yield (block size, result) in order: a source of one block in
    this thread (no hand-offs), larger ones read ahead on a reader thread and sifted a few blocks
    at a time on a pool."""
    blocks = iter_blocks(fh, display, notes)
    first = next(blocks, None)
    if first is None:
        return
    try:
        second = next(blocks, None)
    except READ_ERRORS:
        yield len(first), _sift(first, True)  # the block read before the error, then the error
        raise
    if second is None:
        yield len(first), _sift(first, True)
        return
    yield from _pooled(prefetched(itertools.chain((first, second), blocks), depth=1))


def _the_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="ddp-autopsy-sift")
        return _pool


def _pooled(blocks: Iterator[bytes]) -> Iterator[tuple[int, _Sifted]]:
    pool = _the_pool()
    pending: deque[tuple[int, Future[_Sifted]]] = deque()
    first = True
    known, writers = NO_PREFIX, None
    error: Exception | None = None
    try:
        for block in blocks:
            if first:  # its first lines decide the file's prefixes and writer names
                known, writers = _head(block)
            pending.append((len(block), pool.submit(_sift, block, first, known, writers)))
            first = False
            if len(pending) >= WORKERS:  # (one sifting while the caller takes the other's)
                size, fut = pending.popleft()
                yield size, fut.result()
    except READ_ERRORS as err:  # after the blocks read before it
        error = err
    while pending:
        size, fut = pending.popleft()
        yield size, fut.result()
    if error is not None:
        raise error


# --- many small files: read ahead, sifted many to a batch ------------------------------------

#: (bytes, what the vectorised pass left, or the events of a file classified on the pool): one
#: block of a source, ready for :func:`scan_text`.
Sifted = tuple[int, _Sifted | _Scanned]
#: Files up to this size are read whole and sifted together, many to a polars pass: each polars
#: call costs a fixed ~0.2 ms, and a file sifted alone makes several.
SMALL_FILE = BLOCK_BYTES
#: A batch is sifted once it holds this many bytes or files. What is in flight is peak memory:
#: 256 KB batches, one queued, kept the peak of 256 files of 0.8 MB at that of reading them one
#: by one (111 MB; 4 MB batches five ahead: 170 MB). Bigger batches cost less CPU (1 MB: -15 %
#: at 0.8 MB a file: fewer polars calls) but each MB in flight added ~10 MB to the peak.
BATCH_BYTES = 256 << 10
BATCH_FILES = 512
#: Batches submitted ahead of the one the caller waits for: one more than the pool's threads
#: keeps one queued, so that a thread that finishes starts the next at once (with one ahead,
#: each thread waited for the caller's next ``take``: idle 37-43 % of the time, against 8-14 %;
#: a classified batch keeps only its events, so this costs no memory).
AHEAD = 2
@functools.cache
def _prefixed() -> pl.Expr:
    """The lines that make ``lines.detect`` look further than its one regex (a file without any
    among its first SAMPLE_LINES lines has no prefixes)."""
    return pl.col("text").str.contains(ANY_PREFIX) & (pl.col("text").str.len_bytes() > 0)


def _sift_batch(datas: list[bytes]) -> list[_Sifted]:
    """Sift whole files, each ending with a newline, as one block: exactly what
    ``_sift(data, True)`` gives for each, with one polars pass for all (files whose head shows
    prefixes detect them on their own lines; a batch with invalid UTF-8 is sifted file by file,
    so that only those files are noted)."""
    if len(datas) == 1:
        return [_sift(datas[0], True)]
    if any(len(d) >= QUICK_MIN for d in datas):  # large files alone: see _sift_quick
        return _apart(datas, [len(d) >= QUICK_MIN for d in datas])
    block = b"".join(datas)
    if b"\x1b" in block or has_box(block):  # files with ANSI colours or boxes alone
        return _apart(datas, [b"\x1b" in d or has_box(d) for d in datas])  # (rewritten)
    frame, replaced = _lines(block)
    if replaced:  # the files with invalid UTF-8 alone, the others still together
        bad = [not _utf8(d) for d in datas]
        return _apart(datas, bad) if any(bad) else [_sift(d, True) for d in datas]
    hs = _needle_lines(block, frame,
                       list(itertools.accumulate(map(len, datas)))[:-1]) \
        if _use_hyperscan(block, False) else None
    found: dict[int, frozenset[str]] | None = None
    if hs is not None:
        starts = [0, *hs[1], frame.height]
        cands, found = _rows(frame, hs[0]), dict(zip(hs[0], hs[2], strict=True))
    else:
        starts = list(itertools.accumulate((d.count(b"\n") for d in datas), initial=0))
        cands, found, _ = _candidates(frame, block, False)
    if starts[-1] != frame.height:
        return [_sift(d, True) for d in datas]
    counts = [b - a for a, b in itertools.pairwise(starts)]
    # Prefix detection's samples, one regex pass for all (hits: indices in ``sample``).
    sizes = [min(n, SAMPLE_LINES) for n in counts]
    sample = frame if sizes == counts else pl.concat(
        [frame.slice(start, n) for start, n in zip(starts, sizes, strict=False)], rechunk=False)
    prefixed = sample.select(_prefixed().arg_true()).to_series().to_list() \
        if sample.height else []
    in_sample = list(itertools.accumulate(sizes, initial=0))
    cand_lines = cands["line"].to_list()
    cand_text = cands["text"].to_list()
    out = []
    for i, n in enumerate(counts):
        start = starts[i]
        part = frame.slice(start, n)
        if bisect.bisect_left(prefixed, in_sample[i]) < bisect.bisect_left(
                prefixed, in_sample[i + 1]):
            known, writers = detect(part["text"])
        else:
            known, writers = NO_PREFIX, None
        lo = bisect.bisect_left(cand_lines, start)
        hi = bisect.bisect_left(cand_lines, start + n)
        mine = cands.slice(lo, hi - lo)
        opens = any(o in t for t in cand_text[lo:hi] for o in OPENERS)
        if opens:
            mine = _with_context(mine, part)
        out.append(_Sifted(part, mine, known, False, opens,
                           _tails(part, writers, start, names_ranks(datas[i])), start, found))
    return out


def _apart(datas: list[bytes], alone: list[bool]) -> list[_Sifted]:
    """``datas`` sifted: those marked ``alone`` one by one, the others as a batch."""
    rest = iter(_sift_batch([d for d, a in zip(datas, alone, strict=True) if not a]))
    return [_sift(d, True) if a else next(rest) for d, a in zip(datas, alone, strict=True)]


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Presifter:
    """Small files read and sifted many to a batch on the pool (both cores: reads and polars
    release the GIL), ahead of the caller, handed to :func:`scan_text` one by one in order.

    ``files``: (key, opener, size) of files on disk. A file is read whole when it is at most
    SMALL_FILE bytes, ends with a newline, holds no NUL byte and no byte-order mark, has not
    grown since it was listed, and ``accept(head, key)`` (its first 64 KiB) says it is text; for
    any other, and any file that could not be read, :meth:`take` answers None: the caller reads
    it as before (and notes what it notes). Each batch is read by the pool thread that sifts
    it (a reader thread of its own kept a malloc arena of its own: +10 MB at peak). With
    ``context`` (a file's :class:`FileContext` from its key), each file is classified there too,
    so that the caller's thread only collects events: :func:`scan_text` uses them when it is
    given an equal context (else it classifies the file itself). Use as a context manager:
    leaving cancels the batches not started."""

    def __init__(self, files: list[tuple[Any, Callable[[], IO[bytes]], int | None]],
                 accept: Callable[[bytes, Any], bool],
                 context: Callable[[Any], FileContext] | None = None) -> None:
        small = [(k, o, n) for k, o, n in files if n is not None and 0 < n <= SMALL_FILE]
        large = [f for f in small if f[2] >= QUICK_MIN]
        global _counted
        if len(large) >= NUMPY_AFTER:  # numpy from the first
            _counted = max(_counted, NUMPY_AFTER)
        self._wanted = {id(f[0]) for f in small}
        self._accept = accept
        self._context = context
        #: Notes on the worker processes (one that died, or hung), for the caller to add.
        self.notes: list[InputNote] = []
        self._forked: dict[int, int] = {}  # id(key) -> index in self._large
        self._large = large
        self._procs: ForkPool | None = None
        self._taken = self._declined = 0
        if context is not None and len(large) >= PROCESS_FILES and _processes():
            from ddp_autopsy.analyzer import workers  # (not for a 10-line log: ~3 ms)

            self._forked = {id(f[0]): i for i, f in enumerate(large)}
            small = [f for f in small if id(f[0]) not in self._forked]
            cores = workers.cores()
            # numpy (imported here, once for every child: ~60 ms before they start) saves a
            # child ~0.2 ms a file: worth it from ~300 files a child.
            numpy = len(large) >= NUMPY_AFTER * cores
            if numpy:
                _counted = max(_counted, NUMPY_AFTER)
                _newlines_before(b"", [])
            self._procs = workers.ForkPool(
                large, functools.partial(_scan_alone, accept=accept, context=context),
                cores, PROCESS_CHUNK, setup=functools.partial(_in_worker, numpy),
                child_hook=_child_hook)
        self._batches: deque[list[tuple[Any, Callable[[], IO[bytes]], int]]] = deque()
        size = BATCH_BYTES
        for f in small:  # batches by listed size: nothing is read here
            if size >= BATCH_BYTES or len(self._batches[-1]) >= BATCH_FILES:
                self._batches.append([])
                size = 0
            self._batches[-1].append(f)
            size += f[2]
        self._running: deque[tuple[list[Any], Future[list[Sifted | None]]]] = deque()
        self._ready: dict[int, Sifted | None] = {}
        self._more()

    @property
    def forked(self) -> bool:
        """Whether worker processes are reading (this process waits for them)."""
        return self._procs is not None

    def __enter__(self) -> Presifter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._procs is not None:
            self._procs.close()
        for _, fut in self._running:
            fut.cancel()
        self._running.clear()
        self._batches.clear()
        if self._wanted:
            release_freed_memory()


    def _more(self) -> None:
        while self._batches and len(self._running) <= AHEAD:
            batch = self._batches.popleft()
            self._running.append(([k for k, _, _ in batch], _the_pool().submit(
                _read_and_sift, batch, self._accept, self._context)))

    def take(self, key: Any) -> Sifted | None:
        """``key``'s file sifted, or None when the caller must read it itself."""
        if id(key) not in self._wanted:
            return None
        if (index := self._forked.get(id(key))) is not None:
            return self._take_forked(key, index)
        while id(key) not in self._ready:
            if not self._running:
                return None
            keys, fut = self._running.popleft()
            try:
                results = fut.result()
            except Exception:  # a batch that failed is read again, file by file, by the caller
                results = [None] * len(keys)
            self._ready.update(zip(map(id, keys), results, strict=True))
            self._more()
        return self._ready.pop(id(key))

    def _fall_back(self, index: int) -> None:
        """Most files so far needed polars (prefixed heads: the workers hand them back after
        reading them): the workers are stopped and the files after ``index`` read as before
        this pool existed, in batches on the threads."""
        assert self._procs is not None
        self._procs.close()
        rest = self._large[index + 1:]
        for f in rest:
            del self._forked[id(f[0])]
        self._batches.extend([f] for f in rest)  # (a large file is a batch of its own)
        self._more()

    def _take_forked(self, key: Any, index: int) -> Sifted | None:
        assert self._procs is not None and self._context is not None
        noted = len(self._procs.notes)
        ok, got = self._procs.get(index)
        if len(self._procs.notes) > noted:  # a worker died or hung: said at the file asked
            display = self._context(key).display
            self.notes += [InputNote(display, m) for m in self._procs.notes[noted:]]
        self._taken += 1
        if not ok or got is None:  # lost, or not for a worker: the caller reads it
            self._declined += ok
            if self._taken >= FALLBACK_AFTER and 2 * self._declined >= self._taken:
                self._fall_back(index)
            return None
        size, ctx, rows, notes, stats = got
        again = functools.partial(_read_and_sift, [self._large[index]], self._accept)
        return size, _Scanned(ctx, rows, notes, stats, lambda: again()[0])


# --- many large files: worker processes ------------------------------------------------------

#: A Presifter given this many plain files of QUICK_MIN bytes or more (up to SMALL_FILE) has
#: them read, sifted and classified in forked worker processes, one a core (Linux; not with
#: one core): most of their CPU time is Python holding the GIL, which threads cannot spread.
PROCESS_FILES = 128
#: Files a worker takes at a time (each chunk's events are sent back pickled, ~9 a file).
PROCESS_CHUNK = 8
#: When at least half of the first this many files came back unread (they need polars), the
#: workers are stopped and the rest read on the threads (:meth:`Presifter._fall_back`).
FALLBACK_AFTER = 2 * PROCESS_CHUNK
#: Called in a worker before each file with the number it did so far (tests: a worker killed
#: mid-read).
_child_hook: Callable[[int], None] | None = None


def _processes() -> bool:
    """Whether worker processes may be used: Linux, more than one core, Hyperscan (without it
    every file needs polars, which a worker cannot use) with ANY_PREFIX compiled."""
    from ddp_autopsy.analyzer import workers

    return workers.available() and workers.cores() > 1 and _hyperscan() is not None \
        and _hs_prefix is not None


def _in_worker(numpy: bool) -> None:
    """A worker process's set-up: no polars; numpy only if the parent imported it."""
    global _no_polars, _np
    _no_polars = True
    if not numpy and _np is None:
        _np = False
    # Each file's bytes (and numpy's array of them) from the heap, kept for the next file: a
    # child's malloc gave them back and faulted them in anew every time (361,000 page faults
    # and 0.8 system CPU-s in two children for 1024 files of 0.8 MB; 4,000 and 0.08 s so).
    with suppress(OSError, AttributeError):
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt  # glibc
        mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: above a file's SMALL_FILE bytes
        mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD


def _scan_alone(file: tuple[Any, Callable[[], IO[bytes]], int],
                accept: Callable[[bytes, Any], bool], context: Callable[[Any], FileContext]
                ) -> tuple[int, FileContext, list[dict[str, Any]], list[InputNote], ScanStats
                           ] | None:
    """In a worker process: a large file read, sifted without polars and classified as
    :func:`_read_and_sift` would (its events, notes and counts, and the context they were
    classified for); None when it needs polars (or is not for a batch): the parent reads it."""
    key, opener, size = file
    data = _read_small(key, opener, size, accept)
    if data is None:
        return None
    try:
        sifted = _sift_quick(data)
    except _NeedsPolars:
        return None
    if sifted is None:
        return None
    done = _prescan((len(data), sifted), context(key), lambda: [None])
    return len(data), done.ctx, done.rows, done.notes, done.stats


def release_freed_memory() -> None:
    """Give the allocator's free pages back to the system (glibc's ``malloc_trim``; elsewhere
    nothing): the pool threads' malloc arenas keep what their files' bytes and temporaries
    took, which the rules and reports would otherwise add to (~2 ms)."""
    global _trim
    if _trim is None:
        _trim = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _trim = ctypes.CDLL(None).malloc_trim  # glibc (not musl)
            except (OSError, AttributeError):
                pass
    if _trim:
        _trim(0)


_trim: Any = None



def _read_small(key: Any, opener: Callable[[], IO[bytes]], size: int,
                accept: Callable[[bytes, Any], bool]) -> bytes | None:
    """A file of ``size`` listed bytes, whole, if a batch can read it as it is read alone."""
    try:
        with opener() as fh:
            data = fh.read(size + 1)  # not SMALL_FILE + 1: read() allocates that first
    except READ_ERRORS:
        return None
    # More than listed: a file still being written, read by the caller as it is now.
    if len(data) > size or not data.endswith(b"\n") or b"\x00" in data \
            or data.startswith((codecs.BOM_UTF8, b"\xff\xfe", b"\xfe\xff")):
        return None
    return data if accept(data[:65536], key) else None


def _read_and_sift(batch: list[tuple[Any, Callable[[], IO[bytes]], int]],
                   accept: Callable[[bytes, Any], bool],
                   context: Callable[[Any], FileContext] | None = None) -> list[Sifted | None]:
    datas = [_read_small(key, opener, size, accept) for key, opener, size in batch]
    read = [d for d in datas if d is not None]
    sifted = iter(zip(map(len, read), _sift_batch(read), strict=True)) if read else iter(())
    out: list[Sifted | None] = [None if d is None else next(sifted) for d in datas]
    if context is not None:
        for i, (file, done) in enumerate(zip(batch, out, strict=True)):
            if done is not None:
                out[i] = done[0], _prescan(done, context(file[0]),
                                           functools.partial(_read_and_sift, [file], accept))
    return out


def _prescan(presifted: tuple[int, _Sifted], ctx: FileContext,
             again: Callable[[], list[Sifted | None]]) -> _Scanned:
    """A sifted file classified as :func:`scan_text` would (no progress reported: the caller
    reports it when it takes the events); ``again`` reads and sifts it anew."""
    if ctx.task is None and ctx.rank is None:
        ctx.task = attribution_from_path(ctx.display).task
    notes: list[InputNote] = []
    stats = ScanStats()
    rows = _scan(None, ctx, notes, stats, presifted, None)
    return _Scanned(ctx, rows, notes, stats, lambda: again()[0])  # type: ignore[return-value]


def scan_text(
    fh: IO[bytes] | None, ctx: FileContext, notes: list[InputNote],
    stats: ScanStats | None = None, presifted: Sifted | None = None,
) -> list[dict[str, Any]]:
    """Scan one source (``fh``, or a file :class:`Presifter` read and sifted already); return
    event rows (see :data:`EVENT_SCHEMA`)."""
    stats = stats or ScanStats()
    if ctx.task is None and ctx.rank is None:
        ctx.task = attribution_from_path(ctx.display).task
    report = _progress.get()
    if presifted is not None and isinstance(presifted[1], _Scanned):
        done = presifted[1]
        if done.ctx != ctx:  # classified on the pool for another context: read it again
            again = done.again()
            if again is None:
                notes.append(InputNote(ctx.display, "changed or gone while it was read: "
                                                    "not read", "warning"))
                return []
            return _scan(None, ctx, notes, stats, again, report)
        notes.extend(done.notes)
        stats.lines += done.stats.lines
        stats.bytes += done.stats.bytes
        stats.candidates += done.stats.candidates
        if report is not None:
            report(ctx.display, presifted[0])
        return done.rows
    return _scan(fh, ctx, notes, stats, presifted, report)  # type: ignore[arg-type]


def _scan(fh: IO[bytes] | None, ctx: FileContext, notes: list[InputNote], stats: ScanStats,
          presifted: Sifted | None, report: Callable[[str, int], None] | None
          ) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    state = _State()
    line_no = 0
    try:
        blocks = [presifted] if presifted is not None else \
            _sifted(fh, ctx.display, notes) if fh is not None else []
        for size, sifted in blocks:
            stats.bytes += size
            if sifted.prefix is not None:
                state.prefix = sifted.prefix
            if sifted.replaced and "utf8" not in state.noted:
                notes.append(InputNote(ctx.display, "invalid UTF-8 bytes were replaced by "
                                                    "U+FFFD", "info"))
                state.noted.add("utf8")
            rows: Iterable[tuple[int, str, frozenset[str]]] = sifted.rows
            if not sifted.opens and state.elastic_section is not None:
                # the summary goes on (a frameless block is a file's first: none is open)
                assert sifted.frame is not None and sifted.candidates is not None
                rows = list(_found(_with_context(sifted.candidates, sifted.frame),
                                   sifted.found))
            stats.candidates += len(rows)
            state.block_start, state.block = line_no, sifted
            for line, raw, found in rows:
                if state.spent and _spent(found, raw, state):
                    continue
                if found & _PROCESS_NEEDLES and _redundant_channel(found, raw, state):
                    continue
                _classify(line_no + line - sifted.base + 1, raw.rstrip("\r"), found, ctx, state,
                          events)
                if len(events) > state.prune_at + MAX_EVENTS_PER_KIND:  # mid-block too
                    _prune(events, state, state.prune_at)
                    state.prune_at = len(events)
            _keep_tails(state, sifted.tails, line_no + 1, ctx)
            if len(events) > state.prune_at + MAX_EVENTS_PER_KIND:
                _prune(events, state, state.prune_at)
                state.prune_at = len(events)
            line_no += sifted.lines
            if report is not None:
                report(ctx.display, size)
    except (*READ_ERRORS, pl.exceptions.PolarsError) as err:
        notes.append(InputNote(ctx.display, f"read stopped after line {line_no} "
                                            f"(truncated or corrupt: {err})"))
    _flush_elastic(state, ctx, events)
    _flush_tracebacks(state, ctx, events)
    _prune(events, state, state.prune_at)
    _last_lines(state, ctx, events)
    for kind, n in sorted(state.dropped.items()):
        notes.append(InputNote(ctx.display, f"{n} more '{kind}' lines after the first "
                                            f"{MAX_EVENTS_PER_KIND} were counted, not kept",
                               "info"))
    stats.lines += line_no
    return events


def search(fh: IO[bytes], display: str, notes: list[InputNote], pattern: str | None = None,
           numbers: Collection[int] = ()) -> pl.DataFrame:
    """The raw lines of a source behind its events, streamed like :func:`scan_text`: those
    matching the regex ``pattern`` and those numbered in ``numbers`` (1-based), as a frame of
    ``line, text`` (for evidence context and search over lines no pattern classified)."""
    wanted = pl.lit(False)
    if pattern is not None:
        wanted = wanted | pl.col("text").str.contains(pattern)
    parts = []
    line_no = 0
    try:
        for block in iter_blocks(fh, display, notes):
            frame, _ = _read_lines(block)
            frame = frame.select(pl.col("line").cast(pl.Int64) + line_no + 1, "text")
            hits = wanted | pl.col("line").is_in(list(numbers)) if numbers else wanted
            parts.append(frame.filter(hits))
            line_no += frame.height
    except (*READ_ERRORS, pl.exceptions.PolarsError) as err:
        notes.append(InputNote(display, f"read stopped after line {line_no} (truncated or "
                                        f"corrupt: {err})"))
    return pl.concat(parts) if parts else pl.DataFrame(schema={"line": pl.Int64,
                                                               "text": pl.String})


# --- classification ----------------------------------------------------------------------------

#: ``json.dumps(data, default=str)`` without making an encoder for each event.
_JSON = json.JSONEncoder(default=str)


def _row(kind: str, line: int, info: LineInfo, ctx: FileContext, text: str,
         data: dict[str, Any], stamp: timestamps.Stamp | None = None) -> dict[str, Any]:
    rank, cue = info.rank, info.cue
    if rank is None and ctx.rank is not None:
        rank, cue = ctx.rank, ctx.cue
    stream = "|".join(x for x in (ctx.stream, info.stream) if x) or None
    return {
        "source": ctx.display,
        "line": line,
        "kind": kind,
        "rank": rank,
        "local_rank": info.local_rank if info.local_rank is not None else ctx.local_rank,
        "host": info.host or ctx.host,
        "pid": info.pid or ctx.pid,
        "cue": cue,
        "ts": stamp.ts if stamp else info.ts,
        "clock": stamp.clock if stamp else info.clock,
        "level": info.level,
        "stream": stream,
        "text": text[:TEXT_LIMIT].replace("\x00", ""),
        "data": _JSON.encode(data) if data else None,
    }


def _classify(line: int, raw: str, found: frozenset[str], ctx: FileContext, state: _State,
              events: list[dict[str, Any]]) -> None:
    """Classify a candidate physical line: each message written on it on its own."""
    if line <= state.joined_to:
        return  # read as the end of a hard-wrapped message
    pieces = segments(raw)
    for i, piece in enumerate(pieces):
        # a progress bar the message was glued to (its process's or another's last activity)
        state.glued_to = pieces[i - 1] if i and is_progress(pieces[i - 1]) else None
        _classify_one(line, piece, found, ctx, state, events, i == len(pieces) - 1)


def _classify_one(line: int, raw: str, found: frozenset[str], ctx: FileContext, state: _State,
                  events: list[dict[str, Any]], ends_line: bool) -> None:
    info = parse_line(raw, ctx.reference, state.prefix)
    body = info.body
    _note_last(state, line, raw, info)
    if _elastic(line, raw, body, ctx, state, events):
        return
    stream = (info.stream, info.rank)
    fm = FRAME_LINE.match(body)
    if fm:
        tb = state.tracebacks.get(stream)
        if tb is None:  # frames pasted without their "Traceback (most recent call last):"
            tb = state.tracebacks[stream] = {"line": line, "frames": [], "headless": True}
        if not tb["frames"] and not tb.get("headless"):
            tb["outer"] = fm.group("func").strip()  # (the outermost frame: "<module>" uncaught)
        tb["frames"] = [*tb["frames"][-4:], fm.groupdict()]
        tb["count"] = tb.get("count", 0) + 1
        tb["at"] = (line, raw, info)
        state.code_line[stream] = (line + 1, len(body) - len(body.lstrip()))
        return
    echo = state.code_line.pop(stream, None)
    if echo and echo[0] == line and len(body) - len(body.lstrip()) > echo[1]:
        return  # the program's source echoed by a traceback (`raise RuntimeError("...")`)
    em = P.EXCEPTION_LINE.match(body)
    spawned = state.spawn_index.get(stream) if em else None
    if spawned is not None and info.rank is None:
        # the failed mp.spawn child's exception line: every message on it is that child's
        info = dataclasses.replace(info, rank=spawned, cue="mp.spawn process index")
    for pat in _patterns_for(found):
        if not any(n in body for n in pat.needles):  # a needle in a prefix only
            continue
        fields = pat.match(body)
        text = raw
        # (a match of a message's cut form, a "cut" field, still tries the lines after it: a
        # hard wrap, not a cut, when they complete the message)
        if (fields is None or "cut" in fields) and ends_line:
            whole, joined = _continued(pat, line, raw, body, ctx, state)
            if whole is not None:
                fields, text = whole, joined
        if fields is None:
            continue
        fields.pop("cut", None)
        if pat.kind == "printed_stack":  # its frames are no traceback
            state.tracebacks[stream] = {"line": line, "frames": [], "printed": True}
        elif pat.kind == "traceback":
            state.tracebacks[stream] = {"line": line, "frames": [], "head": (line, raw, info)}
            if state.glued_to:
                state.tracebacks[stream]["after_bar"] = state.glued_to.strip()[:300]
        elif pat.kind == "spawn_failed" and "index" in fields:
            # mp.spawn prints the failed child's traceback right after this header.
            state.spawn_index[stream] = int(fields["index"])
        elif info.rank is None and pat.kind in WRITER_RANK_FIELDS and "rank" in fields:
            info.rank, info.cue = fields["rank"], WRITER_RANK_FIELDS[pat.kind]
        if state.glued_to and pat.kind != "traceback":
            # the progress bar this message was glued to: a process's last activity (its own or
            # another's) when the message was written
            fields = {**fields, "after_bar": state.glued_to.strip()[:300]}
        events.append(_row(pat.kind, line, info, ctx, text, fields))
    if em and not body.lstrip().startswith("Exception raised from"):
        tb = state.tracebacks.pop(stream, None)
        data: dict[str, Any] = {"type": em.group("type"), "msg": (em.group("msg") or "")[:1000]}
        if tb is not None:
            data["traceback_line"] = tb["line"]
            if "after_bar" in tb:
                data["after_bar"] = tb["after_bar"]
            if tb["frames"]:
                last = tb["frames"][-1]
                data["frame"] = {"file": last["file"], "line": int(last["line"]),
                                 "func": last["func"].strip()}
                data["callers"] = [f["func"].strip() for f in tb["frames"][:-1]]
            if "outer" in tb:
                data["outer"] = tb["outer"]
        index = state.spawn_index.pop(stream, None)
        if index is not None and info.rank in (None, index):
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
        m = P.ELASTIC_FIELD.match(body)
        if not (m and m.group("key") == "rank" and "(local_rank: " in m.group("value")):
            return False
        # an entry pasted without the summary's headers: read as the root cause it most
        # likely is (the part of the summary people paste)
        state.elastic_section = "root"
        state.elastic_entry = {"line": line, "raw": raw, "root": True, "headless": True}
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


def _flush_tracebacks(state: _State, ctx: FileContext, events: list[dict[str, Any]]) -> None:
    """A traceback no exception line closed (a fragment: a paste that stops inside it) is a
    failure of its own (``traceback_fragment``), quoted at its innermost frame; not one or two
    frames without a "Traceback" line (a printed stack: unless its frames run through
    torch.distributed, which prints none but a failure's), nor one an exception line follows
    under other prefixes."""
    after = max((e["line"] for e in events if e["kind"] == "exception"), default=0)
    for stream, tb in state.tracebacks.items():
        # (frames without their header: a paste that starts mid-way, from three frames on, or
        # any number through torch.distributed, which prints none but a failure's)
        if tb["line"] <= after or tb.get("printed") or (
                tb.get("headless") and tb.get("count", 0) < 3 and not any(
                "torch/distributed/" in f["file"].replace("\\", "/") for f in tb["frames"])):
            continue
        spawned = state.spawn_index.get(stream)
        if "at" in tb:
            line, raw, info = tb["at"]
            if spawned is not None and info.rank is None:  # under "-- Process N terminated"
                info = dataclasses.replace(info, rank=spawned, cue="mp.spawn process index")
            last = tb["frames"][-1]
            frame = {"file": last["file"], "line": int(last["line"]), "func": last["func"].strip()}
            events.append(_row("traceback_fragment", line, info, ctx, raw,
                               {"traceback_line": tb["line"], "frame": frame,
                                **({"headless": True} if tb.get("headless") else {}),
                                "callers": [f["func"].strip() for f in tb["frames"][:-1]],
                                **({"after_bar": tb["after_bar"]} if "after_bar" in tb else {})}))
        elif "head" in tb:  # cut right after its header (a paste that stops there)
            line, raw, info = tb["head"]
            events.append(_row("traceback_fragment", line, info, ctx, raw,
                               {"traceback_line": tb["line"], "frame": None,
                                **({"after_bar": tb["after_bar"]} if "after_bar" in tb else {})}))
    state.tracebacks.clear()


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
    stamp = timestamps.elastic(entry["time"]) if "time" in entry else None
    info = LineInfo(body="", rank=data.get("rank"), local_rank=data.get("local_rank"),
                    host=data.get("host"), pid=data.get("pid"),
                    cue="torchelastic failure summary")
    # Evidence quotes a real line: the exit code (or the rank) line of the entry.
    line, text = entry.get("exitcode@") or entry.get("rank@") or (entry["line"], entry["raw"])
    events.append(_row("elastic_failure", line, info, ctx, text, data, stamp))


# --- hard-wrapped messages ---------------------------------------------------------------------

def _continued(pat: P.Pattern, line: int, raw: str, body: str, ctx: FileContext,
               state: _State) -> tuple[dict[str, Any] | None, str]:
    """``pat``'s fields when ``body`` is its message cut by a terminal or a paste and the next
    lines (at most MAX_JOINED in all, none with prefixes of its own) complete it; and the joined
    text. Joined as written (a terminal's wrap), else at a space (an editor's)."""
    if state.block is None:
        return None, raw
    start = line - state.block_start  # the next line's index in the block
    exact = spaced = body
    for n, cont in enumerate(state.block.following(start, MAX_JOINED - 1), 1):
        cont = cont.rstrip("\r")
        if not cont or cont.isspace() or _own_line(cont, ctx, state):
            break
        exact, spaced = exact + cont, spaced.rstrip() + " " + cont.strip()
        for joined in (exact, spaced):
            m = pat.regex.search(joined)
            if m is not None and m.start() < len(body):  # the message begins on the first line
                fields = pat.match(joined) or {}
                if "cut" in fields:
                    continue  # still the cut form: not this join
                state.joined_to = line + n
                state.joined.update(range(line + 1, line + n + 1))
                fields["joined_lines"] = n + 1
                return fields, raw[: len(raw) - len(body)] + joined
    return None, raw


def _own_line(text: str, ctx: FileContext, state: _State) -> bool:
    """Whether ``text`` starts a line of its own (a prefix, a stamp, a traceback line)."""
    if FRAME_LINE.match(text) or P.EXCEPTION_LINE.match(text) or text.startswith("Traceback") \
            or NCCL_TRIMMED.match(text):
        return True
    info = parse_line(text, ctx.reference, state.prefix)
    return (info.body != text or info.ts is not None or info.level is not None
            or info.pid is not None)  # an NCCL line: "host:pid:tid [dev] NCCL ..."


# --- each writer's last line -------------------------------------------------------------------

#: A program's own line that opens with the rank that wrote it ("rank 1: uploading ...",
#: "rank=2 step=3 ...", "[Rank 0] saving"): in a console no launcher prefixed (mp.spawn, plain
#: torchrun), the only thing that says whose last line it is.
# (not "[rank3]:", torch's own prefix, nor "[Rank 3]", which the line reader reads already)
SELF_RANK_SOURCE = r"(?i)^(?:global[_ ])?rank[ =:]?(\d+)(?:[:,|]| (?:[^ih]|i[^s]|h[^a]))"
SELF_RANK = re.compile(SELF_RANK_SOURCE)
#: Every line SELF_RANK matches starts so ("global", "rank", any case)...
_SELF_PAIRS = ("gl", "gL", "Gl", "GL", "ra", "rA", "Ra", "RA")
#: ... or after a stamp and a logger's level ("2026-11-25 03:00:01,123 INFO rank 1: ...",
#: moreutils ts' "00:01:17 " or "Nov 25 01:17:16 "): stripped first.
SELF_LEAD = (r"^(?:\[?[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?"
             r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?\]?[ \t]+|(?:[A-Z][a-z]{2} {1,2}[0-9]{1,2} )?"
             r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)? )(?:\[?(?:DEBUG|INFO|WARNING|WARN|ERROR"
             r"|CRITICAL)\]?(?: *[-|:] +| +))?")
SELF_LEAD_RE = re.compile(SELF_LEAD)
#: A line whose first characters may be such a stamp.
_STAMP_START = r"^(?:\[?[0-9]{2}|[A-Z][a-z]{2} )"
_SELF_STAMPED = (b" rank", b" Rank", b" RANK", b" global")


def _stamped_self(data: bytes, start: int) -> bool:
    """Whether ``data``, stamped (its first line opens like a stamp), may hold a line that
    opens with its rank after its stamp, from ``start`` on."""
    first = data[:1]
    return (first.isdigit() or first == b"[" or first.isupper()) \
        and any(data.find(o, start) >= 0 for o in _SELF_STAMPED)


@functools.cache
def _self_exprs() -> tuple[pl.Expr, pl.Expr]:
    """The rank SELF_RANK reads as column ``key``; whether a line can start it."""
    text = pl.col("text")
    body = pl.when(text.str.contains(_STAMP_START)).then(text.str.replace(SELF_LEAD, "")) \
        .otherwise(text)
    return (body.str.extract(SELF_RANK_SOURCE, 1).alias("key"),
            text.str.slice(0, 2).is_in(list(_SELF_PAIRS)) | text.str.contains(_STAMP_START))
_SELF_PAIRS_BYTES = frozenset(p.encode() for p in _SELF_PAIRS)


def self_rank(text: str) -> re.Match[str] | None:
    """SELF_RANK on ``text`` after a stamp and a level it may open with."""
    return SELF_RANK.match(SELF_LEAD_RE.sub("", text, 1) if text[:1].isdigit() or
                           text[:1] == "[" or text[:1].isupper() else text)


def _note_last(state: _State, line: int, text: str, info: LineInfo) -> None:
    if not info.body.strip(BLANK):
        return
    if info.rank is None and (m := SELF_RANK.match(info.body)):
        info = dataclasses.replace(info, rank=int(m.group(1)), cue=SELF_RANK_CUE)
    key = (info.stream, info.rank)
    seen = state.last.get(key)
    if seen is None or line >= seen[0]:
        state.last[key] = (line, text, info)


def _keep_tails(state: _State, tails: list[tuple[int, str, str]], first: int,
                ctx: FileContext) -> None:
    """Keep a block's last lines per writer name (``first``: the block's first line number)."""
    for line, text, key in tails:
        state.tails[key] = (first + line, text)
    if len(state.tails) > TAIL_NAMES:  # names by first characters of many unprefixed lines
        _parse_tails(state, ctx)


#: Of a physical line's messages (a terminal's redraws), the last this many can be last lines.
TAIL_SEGMENTS = 64


def _parse_tails(state: _State, ctx: FileContext) -> None:
    for line, text in sorted(state.tails.values()):
        if line in state.joined:
            continue
        for piece in segments(text, TAIL_SEGMENTS):
            _note_last(state, line, piece, parse_line(piece, ctx.reference, state.prefix))
    state.tails.clear()


def _last_lines(state: _State, ctx: FileContext, events: list[dict[str, Any]]) -> None:
    """One ``last_line`` event per writer (stream and rank as its prefixes say): its last
    non-blank message, a progress bar included (``data.progress``)."""
    _parse_tails(state, ctx)
    for line, text, info in sorted(state.last.values(), key=lambda x: x[0]):
        events.append(_row("last_line", line, info, ctx, text, {"progress": is_progress(text)}))

