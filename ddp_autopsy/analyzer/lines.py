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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

# P1 torchrun --tee/--redirects: "[default0]:" = "[<role><local_rank>]:"; custom templates such as
# "[trainer0|3]:" (role, local rank, global rank) are read too. "[rankN]:" is torch's own (P2/P3).
LAUNCHER = re.compile(r"^\[(?P<role>[A-Za-z_][\w-]*?)(?P<lr>\d+)(?:\|(?P<gr>\d+))?\]:\s?")
# Open MPI --tag-output: "[1,3]<stdout>:"
MPI = re.compile(r"^\[(?P<job>\d+),(?P<rank>\d+)\]<(?:stdout|stderr)>:\s?")
TORCH_RANK = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")
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
    r"(?:Z|[+-]\d\d:?\d\d)?\]?\s+(?:[-|]\s+)?"
)
# NCCL: "host:pid:tid [dev] NCCL INFO ..." (2.26+ WARN lines may carry "[YYYY-mm-dd HH:MM:SS] ").
NCCL = re.compile(
    r"^(?:\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)[^\]]*\] )?"
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<dev>\d+)\] )?.*?NCCL "
    r"(?:INFO|WARN|TRACE|CALL)\b"
)
# P6 ProcessGroupNCCL: "[PG 0 Rank 1] ", "[PG ID 0 PG GUID 0(default_pg) Rank 0] ", "[Rank 0] ".
PG_RANK = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg>\d+)(?: PG GUID [^\s(\]]+(?:\([^)]*\))?)? )?Rank (?P<rank>\d+)\]"
)


@dataclass
class LineInfo:
    body: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    ts: datetime | None = None
    level: str | None = None
    cue: str | None = None
    #: Rank inside a process group (from "[PG .. Rank N]"); global only for PG 0.
    pg: int | None = None
    pg_rank: int | None = None


def _clock(mmdd: str | None, hms: str | None, frac: str | None, year: int) -> datetime | None:
    if not (mmdd and hms):
        return None
    md = int(mmdd)
    try:
        h, m, s = (int(x) for x in hms.split(":"))
        # c10's 9-digit fraction comes from CLOCK_MONOTONIC, not the wall clock: drop it.
        us = int(frac[:6].ljust(6, "0")) if frac and len(frac) <= 6 else 0
        return datetime(year, md // 100, md % 100, h, m, s, us)
    except ValueError:
        return None


def _iso(date: str | None, hms: str | None, frac: str | None) -> datetime | None:
    if not (date and hms):
        return None
    try:
        us = int(frac[:6].ljust(6, "0")) if frac else 0
        return datetime.fromisoformat(f"{date}T{hms}").replace(microsecond=us)
    except ValueError:
        return None


def parse_line(text: str, year: int) -> LineInfo:
    """Strip the known prefixes of ``text``; ``year`` fills in stamps that carry none."""
    info = LineInfo(body=text)
    body = text
    for _ in range(6):  # prefixes stack, but never deeper than this
        m = LAUNCHER.match(body)
        if m and m.group("role") != "rank":
            info.local_rank = int(m.group("lr"))
            if m.group("gr") is not None and info.rank is None:
                info.rank, info.cue = int(m.group("gr")), "launcher prefix rank"
            body = body[m.end() :]
            continue
        m = TORCH_RANK.match(body)
        if m:
            info.rank, info.cue = int(m.group("rank")), "torch [rankN]: prefix"
            body = body[m.end() :]
            continue
        m = MPI.match(body)
        if m:
            if info.rank is None:
                info.rank, info.cue = int(m.group("rank")), "mpirun [job,rank] prefix"
            body = body[m.end() :]
            continue
        m = C10.match(body)
        if m:
            info.level = m.group("sev")
            info.ts = info.ts or _clock(m.group("mmdd"), m.group("hms"), None, year)
            body = body[m.end() :]
            continue
        m = GLOG.match(body)
        if m:
            info.level = m.group("sev")
            info.ts = info.ts or _clock(m.group("mmdd"), m.group("hms"), m.group("frac"), year)
            info.pid = info.pid or int(m.group("pid"))
            body = body[m.end() :]
            continue
        m = PYLOG_BRACKET.match(body) or ISO.match(body)
        if m:
            info.ts = info.ts or _iso(m.group("date"), m.group("hms"), m.group("frac"))
            body = body[m.end() :]
            continue
        break
    m = NCCL.match(body)
    if m:
        info.host = m.group("host")
        info.pid = int(m.group("pid"))
        info.ts = info.ts or _iso(m.group("date"), m.group("hms"), None)
    m = PG_RANK.search(body, 0, 200)
    if m:
        info.pg = int(m.group("pg")) if m.group("pg") is not None else None
        info.pg_rank = int(m.group("rank"))
        # A bare "[Rank N]" or PG 0 names the global rank (PyTorch's default process group).
        if info.rank is None and (info.pg is None or info.pg == 0):
            info.rank, info.cue = info.pg_rank, "message [Rank N]"
    info.body = body
    return info
