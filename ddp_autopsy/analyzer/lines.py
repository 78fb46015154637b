"""Per-line prefixes: who wrote a line and when.

Launchers and loggers stack prefixes in front of a message, e.g.
``[default0]:[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [PG ID 0 ...] ...``.
:func:`parse_line` peels them off, returning the bare message and what the prefixes said (rank,
local rank, host, pid, time), with the cue that decided the rank.

>>> info = parse_line("[default1]:[rank3]:[E1218 20:27:21.426415540 socket.cpp:12] boom", 2024)
>>> (info.rank, info.local_rank, info.body, info.cue)
(3, 1, 'boom', 'torch [rankN]: prefix')
>>> info.ts.isoformat()
'2024-12-18T20:27:21'

Three prefixes are too ambiguous to trust on one line (``RuntimeError: x`` looks like pdsh's
``host: x``): :func:`detect_prefixes` decides them per file, from a sample in which most lines
must carry them, and :func:`parse_line` strips them only when told to.

>>> sample = ["node7:  0: [rank0]: hello", "node7:  1: world", "node8: 12: again"]
>>> prefix = detect_prefixes(sample)
>>> prefix
FilePrefix(pdsh=True, srun=True, bracket=False)
>>> info = parse_line("node8: 12: RuntimeError: boom", 2024, prefix)
>>> (info.host, info.task, info.body, info.stream)
('node8', 12, 'RuntimeError: boom', 'h=node8|t=12')
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from ddp_autopsy.analyzer import timestamps
from ddp_autopsy.analyzer.timestamps import Reference

# --- prefixes decided per file ---------------------------------------------------------------
# pdsh / clush: "node7: msg". Hostnames here must hold a digit, '-' or '.' (or be localhost).
PDSH = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]{0,62}): ")
HOSTLIKE = re.compile(r"^(?:localhost|[A-Za-z0-9_]*[0-9.-][A-Za-z0-9_.-]*)$")
NOT_HOST = re.compile(r"(?i:error|exception|warning|exit|interrupt)$|^(?:INFO|WARN|WARNING|ERROR|"
                      r"DEBUG|CRITICAL|FATAL|NOTE|Note|TODO)$")
# srun --label: "  3: msg" (the task id, right-aligned).
SRUN_LABEL = re.compile(r"^ *(?P<task>[0-9]+): ")
# TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${rank}]:" (torch's documented example) or
# "[${local_rank}]:": which one is unknown, so the number only names the stream. A bare "[0]:"
# is torchelastic's failure-summary entry, not a prefix: a message must follow.
BRACKET = re.compile(r"^\[(?P<n>[0-9]+)\]: ?(?P<rest>\S)")
#: Any of the three, for a quick look (the regexes are kept ASCII: polars compiles them per call).
ANY_FILE_PREFIX = r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,62}| *[0-9]+|\[[0-9]+\]): "

# --- prefixes read on every line -------------------------------------------------------------
# P1 torchrun --tee/--redirects: "[default0]:" = "[<role><local_rank>]:"; custom templates such as
# "[trainer0|3]:" or "[trainer0:3]:" (role, local rank, global rank) are read too. "[rankN]:" is
# torch's own (P2/P3).
LAUNCHER = re.compile(r"^\[(?P<role>[A-Za-z_][\w-]*?)(?P<lr>\d+)(?:[|:](?P<gr>\d+))?\]:\s?")
# Open MPI --tag-output: "[1,3]<stdout>:"
MPI = re.compile(r"^\[(?P<job>\d+),(?P<rank>\d+)\]<(?:stdout|stderr)>:\s?")
TORCH_RANK = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")
# Lightning's rank_prefixed_message: "[rank: 1] msg"
LIGHTNING = re.compile(r"^\[rank: (?P<rank>\d+)\]\s")
# P2 c10 logger: "[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] " (≤2.3: no time).
C10 = re.compile(
    r"^\[(?P<sev>[IWEF])(?:(?P<mmdd>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d)\.(?P<frac>\d+))? "
    r"(?P<src>[\w./-]+):(?P<srcline>\d+)\]\s?"
)
# glog style (torchelastic ≈2.3+, glog builds): "W1026 03:51:31.222000 2521679 path/api.py:908] "
GLOG = re.compile(
    r"^(?P<sev>[IWEF])(?P<mmdd>\d{4}) (?P<hms>\d\d:\d\d:\d\d)\.(?P<frac>\d+)\s+(?P<pid>\d+) "
    r"(?P<src>\S+?):(?P<srcline>\d+)\]\s?"
)
# Python logging: "[2024-04-10 16:02:56,193] torch.distributed...: [WARNING] " and "WARNING:name:"
PYLOG_BRACKET = re.compile(
    r"^\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)[,.](?P<frac>\d+)\] "
    r"(?:(?P<logger>[\w.]+): )?(?:\[(?P<level>[A-Z]+)\]\s?)?"
)
PYLOG_PLAIN = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<logger>[\w.]+):")
ISO = re.compile(
    r"^\[?(?P<date>\d{4}-\d\d-\d\d)[T ](?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?"
    r"(?P<zone>Z|[+-]\d\d:?\d\d)?\]?\s+(?:[-|]\s+)?"
)
# DeepSpeed's logger, after its "[date] [LEVEL] ": "[engine.py:1234:__init__] "
DEEPSPEED_SRC = re.compile(r"^\[[\w.-]+\.py:\d+:[\w<>]+\]\s")
# NCCL: "host:pid:tid [dev] NCCL INFO ..."; 2.26+ may stamp it: "[2025-05-01 10:11:12] host:...".
NCCL = re.compile(
    r"^(?:\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?[^\]]*\] )?"
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<dev>\d+)\] )?.*?NCCL "
    r"(?:INFO|WARN|TRACE|CALL)\b"
)
# P6 ProcessGroupNCCL: "[PG 0 Rank 1] ", "[PG ID 0 PG GUID 0(default_pg) Rank 0] ", "[Rank 0] ".
PG_RANK = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg>\d+)(?: PG GUID [^\s(\]]+(?:\([^)]*\))?)? )?Rank (?P<rank>\d+)\]"
)

#: Lines sampled to decide a file's prefixes, and the share of them that must carry one.
SAMPLE_LINES = 2000
MAJORITY = 0.6


@dataclass(frozen=True)
class FilePrefix:
    """Prefixes that most lines of a file carry (see :func:`detect_prefixes`)."""

    pdsh: bool = False
    srun: bool = False
    bracket: bool = False


NO_PREFIX = FilePrefix()


@dataclass
class LineInfo:
    body: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    ts: datetime | None = None
    clock: str | None = None
    level: str | None = None
    cue: str | None = None
    #: Rank inside a process group (from "[PG .. Rank N]"); global only for PG 0.
    pg: int | None = None
    pg_rank: int | None = None
    #: srun --label task id (a rank or a node: decided per file, see ``attribution``).
    task: int | None = None
    #: Number of a custom launcher prefix "[N]:" (a rank or a local rank: decided per file).
    slot: int | None = None
    #: The writer's identity as the line prefixes name it, e.g. "h=node8|t=12|l=0".
    stream: str | None = None


def _carried(lines: pl.Series, rx: re.Pattern[str]) -> tuple[bool, pl.Series]:
    """Whether most ``lines`` carry the prefix ``rx``; the lines with it stripped if they do."""
    pattern = rx.pattern.replace("(?P<rest>\\S)", "\\S")
    prefix = lines.str.extract(f"({pattern})", 1)
    if rx is PDSH:
        host = lines.str.extract(rx.pattern, 1)
        prefix = pl.select(
            pl.when(host.str.contains(HOSTLIKE.pattern) & ~host.str.contains(NOT_HOST.pattern))
            .then(prefix)
        ).to_series()
        hosts = host.filter(prefix.is_not_null()).n_unique()
    hits = prefix.is_not_null().sum()
    enough = hits >= min(2, lines.len()) and hits >= MAJORITY * lines.len()
    if rx is PDSH and hosts > max(2, hits // 2):
        enough = False  # a different "host" on every line: words, not hosts
    if not enough:
        return False, lines
    if rx is BRACKET:  # the first character of the message was part of the match
        prefix = prefix.str.slice(0, prefix.str.len_chars() - 1)
    return True, lines.str.slice(prefix.str.len_chars().fill_null(0))


def _is_host(token: str) -> bool:
    return bool(HOSTLIKE.match(token)) and not NOT_HOST.search(token)


def detect_prefixes(sample: Sequence[str | None] | pl.Series) -> FilePrefix:
    """Decide the per-file prefixes from a file's first SAMPLE_LINES lines (empty ones ignored)."""
    lines = pl.Series("text", sample, dtype=pl.String).head(SAMPLE_LINES)
    lines = lines.filter(lines.str.len_bytes() > 0)
    if lines.len() == 0 or lines.str.contains(ANY_FILE_PREFIX).sum() < MAJORITY * lines.len():
        return NO_PREFIX  # the common answer, found with one regex
    pdsh, lines = _carried(lines, PDSH)
    srun, lines = _carried(lines, SRUN_LABEL)
    bracket, _ = _carried(lines, BRACKET)
    return FilePrefix(pdsh=pdsh, srun=srun, bracket=bracket)


def parse_line(text: str, ref: Reference | int, prefix: FilePrefix = NO_PREFIX) -> LineInfo:
    """Strip the known prefixes of ``text``; ``ref`` (or a year) fills in stamps with no year."""
    if isinstance(ref, int):
        ref = Reference(ref)
    info = LineInfo(body=text)
    parts: list[str] = []  # the stream's name, from prefixes only
    body = _file_prefixes(text, prefix, info, parts)
    for _ in range(8):  # prefixes stack, but never deeper than this
        m = LAUNCHER.match(body)
        if m and m.group("role") != "rank":
            info.local_rank = int(m.group("lr"))
            parts.append(f"l={info.local_rank}")
            if m.group("gr") is not None and info.rank is None:
                info.rank, info.cue = int(m.group("gr")), "launcher prefix rank"
            body = body[m.end() :]
            continue
        m = TORCH_RANK.match(body) or LIGHTNING.match(body)
        if m:
            torch = m.re is TORCH_RANK
            info.rank = int(m.group("rank"))
            info.cue = "torch [rankN]: prefix" if torch else "Lightning [rank: N] prefix"
            body = body[m.end() :]
            continue
        m = MPI.match(body)
        if m:
            if info.rank is None:
                info.rank, info.cue = int(m.group("rank")), "mpirun [job,rank] prefix"
            body = body[m.end() :]
            continue
        m = C10.match(body) or GLOG.match(body)
        if m:
            info.level = m.group("sev")
            _stamp(info, timestamps.glog(m.group("mmdd"), m.group("hms"), m.group("frac"), ref))
            if m.re is GLOG:
                info.pid = info.pid or int(m.group("pid"))
            body = body[m.end() :]
            continue
        m = PYLOG_BRACKET.match(body) or ISO.match(body)
        if m:
            zone = m.group("zone") if m.re is ISO else None
            _stamp(info, timestamps.iso(m.group("date"), m.group("hms"), m.group("frac"), zone))
            body = body[m.end() :]
            continue
        m = DEEPSPEED_SRC.match(body)
        if m:
            body = body[m.end() :]
            continue
        break
    m = NCCL.match(body)
    if m:
        info.host = m.group("host")
        info.pid = int(m.group("pid"))
        _stamp(info, timestamps.iso(m.group("date"), m.group("hms"), m.group("frac")))
    m = PG_RANK.search(body, 0, 200)
    if m:
        info.pg = int(m.group("pg")) if m.group("pg") is not None else None
        info.pg_rank = int(m.group("rank"))
        # A bare "[Rank N]" or PG 0 names the global rank (PyTorch's default process group).
        if info.rank is None and (info.pg is None or info.pg == 0):
            info.rank, info.cue = info.pg_rank, "message [Rank N]"
    info.body = body
    info.stream = "|".join(parts) or None
    return info


def _file_prefixes(text: str, prefix: FilePrefix, info: LineInfo, parts: list[str]) -> str:
    body = text
    if prefix.pdsh:
        m = PDSH.match(body)
        if m and _is_host(m.group("host")):
            info.host = m.group("host")
            parts.append(f"h={info.host}")
            body = body[m.end() :]
    if prefix.srun:
        m = SRUN_LABEL.match(body)
        if m:
            info.task = int(m.group("task"))
            parts.append(f"t={info.task}")
            body = body[m.end() :]
    if prefix.bracket:
        m = BRACKET.match(body)
        if m:
            info.slot = int(m.group("n"))
            parts.append(f"s={info.slot}")
            body = body[m.start("rest") :]
    return body


def _stamp(info: LineInfo, stamp: timestamps.Stamp | None) -> None:
    if stamp is not None and info.ts is None:
        info.ts, info.clock = stamp.ts, stamp.clock
