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

Four prefixes are too ambiguous to trust on one line (``RuntimeError: x`` looks like pdsh's
``host: x``, a table row like docker compose's ``svc-1  | x``): :func:`detect_prefixes` decides
them per file, from a sample in which most lines must carry them, and :func:`parse_line` strips
them only when told to.

>>> sample = ["node7:  0: [rank0]: hello", "node7:  1: world", "node8: 12: again"]
>>> prefix = detect_prefixes(sample)
>>> prefix
FilePrefix(pdsh=True, srun=True, bracket=False, compose=False, quote=False, pytest=0)
>>> info = parse_line("node8: 12: RuntimeError: boom", 2024, prefix)
>>> (info.host, info.task, info.body, info.stream)
('node8', 12, 'RuntimeError: boom', 'h=node8|t=12')

Followed by a prefix that names a writer, a label or a host is read on its own line too:

>>> info = parse_line("12: [rank12]: RuntimeError: boom", 2024)
>>> (info.task, info.rank, info.body)
(12, 12, 'RuntimeError: boom')

pytest's failure report marks its lines with ``E`` and padding, decided per file the same way
(most lines carry it, or pytest's own headers are there), and stripped after the other file
prefixes:

>>> report = ["E       RuntimeError: boom", "E", '_______ test_x _______']
>>> parse_line(report[0], 2024, detect_prefixes(report)).body
'RuntimeError: boom'

rich's boxed tracebacks (``rich.traceback.install()``) are rewritten as Python prints a
traceback before anything reads them: :func:`unbox`, in polars, on the blocks that hold a box.

A captured terminal holds ``\\r``-redrawn progress bars: :func:`segments` splits a physical line
into the messages written on it (the line number stays the physical line's).

>>> segments("Map:  41%|####      | 4100/10000 [02:10<03:07, 31.4 ex/s][rank1]: RuntimeError: x")
['Map:  41%|####      | 4100/10000 [02:10<03:07, 31.4 ex/s]', '[rank1]: RuntimeError: x']
>>> is_progress('Map:  41%|####      | 4100/10000 [02:10<03:07, 31.4 ex/s]')
True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import polars as pl

from ddp_autopsy.analyzer import timestamps
from ddp_autopsy.analyzer.timestamps import Reference

# --- prefixes decided per file ---------------------------------------------------------------
# pdsh / clush: "node7: msg". Hostnames here must hold a digit, '-' or '.' (or be localhost).
PDSH = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]{0,62}): ")
HOSTLIKE = re.compile(r"^(?:localhost|[A-Za-z0-9_]*[0-9.-][A-Za-z0-9_.-]*)$")
# Nor a Python logger's name ("torch.distributed.elastic.multiprocessing.api: [ERROR] ...").
NOT_HOST = re.compile(r"(?i:error|exception|warning|exit|interrupt)$|^(?:INFO|WARN|WARNING|ERROR|"
                      r"DEBUG|CRITICAL|FATAL|NOTE|Note|TODO)$|^[a-z_]+(?:\.[a-z_]+){2,}$"
                      # nor an RDMA provider's name ("mlx5: host1: got completion with error:")
                      r"|^(?:mlx[45]|hfi1|bnxt_re|efa)(?:_\d+)?$"
                      # nor a bare number: srun --label's task id ("22: ...")
                      r"|^\d+$"
                      # nor a Python script: argparse's "train.py: error: ..." on every rank
                      r"|^[\w-]+\.py$")
# srun --label: "  3: msg" (the task id, right-aligned).
SRUN_LABEL = re.compile(r"^ *(?P<task>[0-9]+): ")
# TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${rank}]:" (torch's documented example) or
# "[${local_rank}]:": which one is unknown, so the number only names the stream. A bare "[0]:"
# is torchelastic's failure-summary entry, not a prefix: a message must follow.
BRACKET = re.compile(r"^\[(?P<n>[0-9]+)\]: ?(?P<rest>\S)")
# A log quoted in a bug report (Markdown: "> Traceback (most recent call last):") or by a
# report tool that indents and bars it ("        | [rank0]: Traceback ..."; a Markdown table
# row starts at the margin).
QUOTE = re.compile(r"^(?:(?:> ?)+|[ \t]+\| ?)")  # (a quote of a quote: "> > ")
# docker compose: "svc-1  | msg" (the service name padded to the longest one).
COMPOSE = re.compile(r"^(?P<svc>[A-Za-z0-9_.-]*[A-Za-z][A-Za-z0-9_.-]*) +\| ")
# pytest's failure report: "E" and the failing statement's indent less one ("E       msg"), the
# same for every line of one exception (its own indentation follows); a blank line is "E".
PYTEST_E = r"^E(?: +\S|$)"
# ... in a pytest report: a test's header "____ test_x ____", a section "==== FAILURES ====",
# the summary "FAILED tests/test_x.py::test_y - ..." (or a file of nothing but "E" lines).
PYTEST_MARK = (r"^_{3,} .*\S.* _{3,}$|^={3,} (?:FAILURES|ERRORS|short test summary info) ={3,}$"
               r"|^(?:FAILED|ERROR) \S+::|^-{3,} Captured (?:stdout|stderr|log)(?: \w+)? -{3,}$")
#: Any of them, for a quick look (the regexes are kept ASCII: polars compiles them per call).
ANY_FILE_PREFIX = (r"^(?:(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,62}| *[0-9]+|\[[0-9]+\]): "
                   r"|[A-Za-z0-9_.-]*[A-Za-z][A-Za-z0-9_.-]* +\| |>|[ \t]+\| |E(?: +\S|$))")

# --- prefixes read on every line -------------------------------------------------------------
# P1 torchrun --tee/--redirects: "[default0]:" = "[<role><local_rank>]:"; custom templates such as
# "[trainer0|3]:" or "[trainer0:3]:" (role, local rank, global rank) are read too. "[rankN]:" is
# torch's own (P2/P3).
LAUNCHER = re.compile(r"^\[(?P<role>[A-Za-z_][\w-]*?)(?P<lr>\d+)(?:[|:](?P<gr>\d+))?\]:\s?")
# ... and torchrun --role "$(hostname -s):" --tee: "[host1:0]" + the text, the role ending in ":"
# and no colon after the bracket (a local rank of at most three digits: not "[node-0:29500]";
# not a logger's source, "[train.py:650]").
ROLE_TEE = re.compile(r"^\[(?P<role>[A-Za-z_][\w.-]*)(?<!\.py):(?P<lr>\d{1,3})\](?!:)")
# Open MPI --tag-output: "[1,3]<stdout>:"; horovodrun's own (Gloo) launcher: "[3]<stderr>:";
# SageMaker's mpirun (smdistributed, its PyTorch containers): "[1,mpirank:3,algo-1]<stderr>:"
MPI = re.compile(r"^\[(?:(?P<job>\d+),)?(?:mpirank:)?(?P<rank>\d+)(?:,(?P<host>[A-Za-z0-9]"
                 r"[\w.-]{0,62}))?\]<(?:stdout|stderr)>:\s?")
TORCH_RANK = re.compile(r"^\[[Rr]ank(?P<rank>\d+)\]:\s?")  # (some forks print "[Rank7]:")
# Lightning's rank_prefixed_message: "[rank: 1] msg"; trainers' own loggers: "[RANK 4] msg"
LIGHTNING = re.compile(r"^\[rank: (?P<rank>\d+)\]\s")
UPPER_RANK = re.compile(r"^\[(?:RANK |rank)(?P<rank>\d+)\]\s")  # (also "[rank6] msg")
RANK_CUES = {TORCH_RANK.pattern: "torch [rankN]: prefix",
             LIGHTNING.pattern: "Lightning [rank: N] prefix", UPPER_RANK.pattern: "[RANK N] prefix"}
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
# (a platform's console may stamp minutes only, after a blank: " 2025-02-18 12:54 [rank12]:")
ISO = re.compile(
    r"^ ?\[?(?P<date>\d{4}-\d\d-\d\d)[T ](?P<hms>\d\d:\d\d(?::\d\d)?)(?:[.,](?P<frac>\d+))?"
    r"(?P<zone>Z|[+-]\d\d:?\d\d)?\]?\s+(?:[-|]\s+)?"
)
# A log collector's host or pod after its stamp: "2026-01-09 17:40:31.169213 master-0 >> msg"
COLLECTOR_HOST = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]{0,62}) >> ")
# DeepSpeed's logger, after its "[date] [LEVEL] ": "[engine.py:1234:__init__] "
DEEPSPEED_SRC = re.compile(r"^\[[\w.-]+\.py:\d+:[\w<>]+\]\s")
# k2-fsa's icefall setup_logger and the recipes that copy it (lhotse, vall-e, speechbrain
# recipes): "%(asctime)s %(levelname)s [%(filename)s:%(lineno)d] ({rank}/{world_size}) msg"
RANK_OF_WORLD = re.compile(r"^\[[\w.-]+\.py:\d+\] \((?P<rank>\d+)/(?P<world>\d+)\) ")
# NCCL: "host:pid:tid [dev] NCCL INFO ..."; 2.26+ may stamp it: "[2025-05-01 10:11:12] host:...".
NCCL = re.compile(
    r"^(?:\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?[^\]]*\] )?"
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<dev>\d+)\] )?.*?NCCL "
    r"(?:INFO|WARN|TRACE|CALL)\b"
)
# Ray: "(RayTrainWorker pid=2372, ip=10.0.1.5) msg", "(pid=123, ip=10.0.0.1) msg": a worker
# process, not a rank (its "[rankN]:" may follow). vLLM's multiprocessing workers name their rank
# the same way: "(VllmWorker rank=1 pid=4888) msg", V1's by tensor-parallel rank: "(VllmWorker
# TP1 pid=4888) msg". A task's name may end in a comma, as
# SkyPilot's and Ray's local workers print it without "ip=": "(train-job-2, pid=16959) msg".
RAY = re.compile(
    r"^\((?:(?P<actor>[A-Za-z_][\w.:-]*),? )?(?:(?:rank=|TP)(?P<rank>\d+) )?pid=(?P<pid>\d+)"
    r"(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\) ?"
)
# A log viewer's time of day before the process's own prefixes: "11:31:42.990 (WorkerDict
# pid=10872) [rank5]:...", moreutils' `ts -s` / `ts -i` elapsed time ("00:01:17 msg"), its
# default "Nov 25 01:17:16 msg" (no date or no year: stripped, not used as a stamp)
TIME_OF_DAY = re.compile(r"^(?:(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2} )?"
                         r"\d\d:\d\d:\d\d(?:[.,]\d{1,9})? (?=.)")
# SGLang's logger: "[2025-08-28 21:19:34 DP1 TP3] msg" (the stamp is read first, then its
# parallel ranks, which are ranks within their groups, not global ones), and with the process:
# "2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10 scheduler.py:2655] msg".
SGLANG_GROUPS = re.compile(r"^(?:(?:DP|TP|EP|PP|CP)\d+ ?)+\] ")
SGLANG_SOURCE = re.compile(r"^\d+ \[ ?(?:(?:DP|TP|EP|PP|CP)\d+ )*[\w./-]+\.py:\d+\] ")
# vLLM / SGLang's logger: "ERROR 07-08 10:09:09 [core.py:583] msg" (level, month-day, time, source)
LEVEL_FIRST = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mm>\d\d)-(?P<dd>\d\d) "
    r"(?P<hms>\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))? \[?[\w./-]+:\d+\] "  # (vLLM < 0.8: no "[")
)
# The CRI log format (containerd, CRI-O: /var/log/pods/*/*.log on a Kubernetes node), after its
# RFC 3339 stamp: "2026-11-25T03:00:01.123456789Z stderr F msg" (P: a partial line).
CRI_STREAM = re.compile(r"^(?:stdout|stderr) [FP] ")
# syslog / journalctl's default output: "Nov 25 03:00:01 gpu-node-7 python[41235]: msg", and
# after an ISO stamp (journalctl -o short-iso) "gpu-node-7 python[41235]: msg". The pid is the
# process that opened the journal stream (the launcher for all its workers): not kept.
SYSLOG = re.compile(
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(?P<day>\d{1,2}) "
    r"(?P<hms>\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))? (?P<host>[A-Za-z0-9][\w.-]{0,62}) "
    r"(?:[A-Za-z_][^\s\[\]:]*\[\d+\]|kernel): "
)
# Grafana Loki's logcli, its default output: the stamp, the stream's label set, the line:
# '2026-11-25T03:00:01Z {job="train", pod="trainer-0"} msg'
LOKI_LABELS = re.compile(r'^\{(?:[A-Za-z_][\w.]*="(?:[^"\\]|\\.)*"(?:, ?)?)+\} ')
SYSLOG_TAIL = re.compile(r"^(?P<host>[A-Za-z0-9][\w.-]{0,62}) [A-Za-z_][^\s\[\]:]*\[\d+\]: ")
MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
# Determined's trial logs: "[2024-03-15T16:29:06.552162Z] 5c902731 [rank=0] || msg" (the stamp,
# the container's id, the rank when the line is a worker's), or "[rank=1] || msg" alone
DETERMINED = re.compile(r"^(?:[0-9a-f]{8} )?(?:\[rank=(?P<rank>\d+)\] )?\|\| ?")
# kubectl logs --prefix: "[pod/trainer-worker-0/pytorch] msg"
KUBECTL = re.compile(r"^\[pod/(?P<pod>[^/\]\s]+)(?:/(?P<container>[^\]\s]+))?\] ?")
# Python logging's level after a stamp: "2024-05-01 12:00:01,123 - INFO - msg", "... INFO     msg"
LEVEL = re.compile(
    r"^\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?(?: *[-|:] +| +)"
)
LEVELS = {"INFO": "I", "WARNING": "W", "WARN": "W", "ERROR": "E", "CRITICAL": "F", "FATAL": "F"}
# P6 ProcessGroupNCCL: "[PG 0 Rank 1] ", "[PG ID 0 PG GUID 0(default_pg) Rank 0] ", "[Rank 0] ".
PG_RANK = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg>\d+)(?: PG GUID [^\s(\]]+(?:\([^)]*\))?)? )?Rank (?P<rank>\d+)\]"
)

# --- what a terminal leaves in a captured log -------------------------------------------------
#: ANSI escape sequences (colours, cursor moves, titles); ASCII and Rust-compatible (polars).
ANSI = r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[()][0-9A-Za-z]|[=>78])"
ANSI_RE = re.compile(ANSI)
# tqdm: "Map:  41%|####      | 4100/10000 [02:10<03:07, 31.4 ex/s]" (and "4100it [02:10, 31.4it/s]")
PROGRESS = re.compile(r"[0-9]%\||[0-9](?:it|[A-Za-z]+/s|s/[A-Za-z]+)\]\s*$")
# A bar's end when more text follows it on the same line (a redraw whose "\r" was lost).
BAR_END = re.compile(r"[0-9]+%\|[^|\r]*\|[^\[\]\r|]*\[[^\]\r]*\] *(?=\S)")


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def is_progress(text: str) -> bool:
    """Whether ``text`` is a progress bar (tqdm's format)."""
    return PROGRESS.search(text) is not None


def segments(text: str, last: int | None = None) -> list[str]:
    """The messages written on one physical line: split at ``\\r`` (a terminal redraw) and after a
    progress bar with more text glued to it; blank pieces dropped. ``last``: only the pieces of
    the last so many redraws."""
    if "\r" not in text and "%|" not in text:
        if _TRACEBACK in text and (m := GLUED_TRACEBACK.search(text)) is not None:
            return [text[: m.start() + 1], text[m.start() + 1:]]
        return [text]
    out: list[str] = []
    for piece in text.split("\r") if last is None else text.rsplit("\r", last)[-last:]:
        while (m := BAR_END.search(piece)) is not None:
            out.append(piece[: m.end()].rstrip(" "))
            piece = piece[m.end():]
        out.append(piece)
    return [x for x in out if x.strip()]


#: A traceback's header glued to the text before it with nothing between (a bar cut mid-word,
#: "908.45 eTraceback (most recent call last):"): a prefix ends with ":", "]" or a space.
GLUED_TRACEBACK = re.compile(r"[A-Za-z0-9](?=Traceback \(most recent call last\):)")


# --- rich's boxed tracebacks (rich.traceback.install(): accelerate, Lightning CLI, typer...) -----
# rich/traceback.py draws a Panel (box.ROUNDED, padding 0 1) titled "Traceback (most recent call
# last)" around the frames, each "<file>:<line> in <func>" ("in <func>:<line>" when the file does
# not exist), a blank line and the code around it with line numbers ("❱ 388 │ code" the current
# one); the box is as wide as the terminal (100 when not one), a long header is wrapped inside
# it. "<Type>: <message>" follows the box, the type unqualified ("OutOfMemoryError: ...").
#: The box's side; a block holding none of its bytes is not looked at.
BOX_SIDE = "│"
BOX_BYTES = BOX_SIDE.encode()


def has_box(block: bytes) -> bool:
    """Whether ``block`` holds a box's side (E2 94 82): each of its bytes first, one memchr each
    (0.5 ms per 4 MB, where the search for all 3 takes 5-15), which a block of ASCII and tqdm's
    bars (E2 96 8x) never passes."""
    return b"\x94" in block and b"\x82" in block and b"\xe2" in block and BOX_BYTES in block

_BOX = r"^(?P<_pre>[^│╭╰]*)(?P<_edge>[│╭╰])(?P<_body>.*)[│╮╯][ \t\r]*$"
_BOX_CODE = r"^(?:❱ +)?[0-9]+(?: |$)|^[│╭╰]"  # a numbered code line, a nested panel (locals)
_BOX_HEADER = r"^\S.*:[0-9]+ in \S+$|^in \S+:[0-9]+$"
#: A frame header's last piece when the box wrapped it inside its line number ("...py:" then
#: "7 in _wrap"): no code line (Python has no statement "in name").
_BOX_HEADER_END = r"^[0-9]+ in [\w<>.]+$"
_TRACEBACK = "Traceback (most recent call last):"


def unbox(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s ``text`` with rich's traceback boxes read as Python prints a traceback: the
    title line as "Traceback (most recent call last):", each frame header (joined when wrapped)
    as '  File "<file>", line <n>, in <func>', code lines (the program's source, not its output)
    and borders blank, other lines in the box as their text; whatever precedes a box line (its
    prefixes) kept. A box whose top is not there (a paste that starts inside it) opens with a
    "Traceback" line at its first blank or code line, so that a fragment is still a traceback.
    Lines outside boxes are left as they are; line numbers stay."""
    c = pl.col
    # Only box lines are looked at (a few in a block of thousands): "the line before" below is
    # the box line before, and "_i" says whether it is the physical line before.
    boxes = (frame.lazy().select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i"), "text")
             .filter(c("text").str.contains("[│╭╰]"))
             .with_columns(c("text").str.extract_groups(_BOX).alias("_g")).unnest("_g")
             .filter(c("_edge").is_not_null())
             .with_columns(
                 c("_body").str.strip_chars(" ").alias("_content"),
                 (c("_edge") == BOX_SIDE).alias("_side"),
                 # The content reaches the box's right side: a header may go on below.
                 c("_body").str.contains(r"\S ?$").alias("_full"),
                 c("_pre").str.replace_all("[0-9]", "").alias("_shape"),  # prefixes, no stamps
             ).with_columns(
                 (c("_side") & (c("_content") == "")).alias("_blank"),
                 (c("_side") & c("_content").str.contains(_BOX_CODE)
                  & ~c("_content").str.contains(_BOX_HEADER_END)).alias("_code"),
             ).with_columns((c("_side") & ~c("_blank") & ~c("_code")).alias("_textual")))
    # The box line n lines away is the writer's physical line n lines away.
    near = {n: ((c("_i").shift(-n) == c("_i") + n) & (c("_shape").shift(-n) == c("_shape")))
            .fill_null(False) for n in (-1, 1, 2)}
    textual = {n: c("_textual").shift(-n).fill_null(False) & near[n] for n in (-1, 1, 2)}
    sep = pl.when(c("_full")).then(pl.lit("")).otherwise(pl.lit(" "))
    two = c("_content") + sep + c("_content").shift(-1)
    three = two + sep.shift(-1) + c("_content").shift(-2)
    start = c("_textual") & ~textual[-1]
    boxes = boxes.with_columns(
        (pl.when(start & c("_content").str.contains(_BOX_HEADER)).then(c("_content"))
         .when(start & textual[1] & two.str.contains(_BOX_HEADER)).then(two)
         .when(start & textual[1] & textual[2] & three.str.contains(_BOX_HEADER)).then(three))
        .alias("_header"),
        two.alias("_two"),
        (~near[-1]).cum_sum().alias("_run"),  # runs of a writer's consecutive box lines
    ).with_columns(
        pl.when(c("_header").is_null()).then(0).when(c("_header") == c("_content")).then(1)
        .when(c("_header") == c("_two")).then(2).otherwise(3).alias("_joined"),
        # A box without its top (a table has rows like code lines: a traceback has frame
        # headers or a current line): the first blank or code line of its run opens it.
        ((c("_blank") | c("_code"))
         & ((c("_blank") | c("_code")).cast(pl.Int32).cum_sum().over("_run") == 1)
         & ~(c("_edge") == "╭").any().over("_run")
         & (c("_header").is_not_null() | c("_content").str.starts_with("❱")).any().over("_run"))
        .alias("_first"),
    )
    frame_line = (
        c("_header").str.replace(r"^(\S.*):([0-9]+) in (\S+)$", '  File "${1}", line ${2}, in ${3}')
        .str.replace(r"^in (\S+):([0-9]+)$", '  File "<unknown>", line ${2}, in ${1}'))
    top = (c("_edge") == "╭") & c("_body").str.contains("Traceback", literal=True)
    consumed = ((c("_joined").shift(1) >= 2) & near[-1]).fill_null(False) \
        | ((c("_joined").shift(2) == 3) & (c("_i").shift(2) == c("_i") - 2)).fill_null(False)
    pre = c("_pre")
    text = (pl.when(top | (c("_side") & c("_first"))).then(pre + _TRACEBACK)
            .when(c("_edge") == "╭").then(c("text"))
            .when(c("_header").is_not_null()).then(pre + frame_line)
            .when(consumed | c("_blank") | c("_code") | (c("_edge") == "╰")).then(pre)
            .otherwise(pre + c("_content")))
    new = boxes.select("_i", text.alias("text")).collect()
    if new.height == 0:
        return frame
    return frame.with_columns(frame["text"].scatter(new["_i"], new["text"]))


#: Lines sampled to decide a file's prefixes, and the share of them that must carry one.
SAMPLE_LINES = 2000
MAJORITY = 0.6


@dataclass(frozen=True)
class FilePrefix:
    """Prefixes that most lines of a file carry (see :func:`detect_prefixes`)."""

    pdsh: bool = False
    srun: bool = False
    bracket: bool = False
    compose: bool = False
    quote: bool = False
    #: pytest's "E" marker and this many spaces at most (0: none).
    pytest: int = 0


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
    elif rx is COMPOSE:
        hosts = lines.str.extract(rx.pattern, 1).filter(prefix.is_not_null()).n_unique()
    hits = prefix.is_not_null().sum()
    enough = hits >= min(2, lines.len()) and hits >= MAJORITY * lines.len()
    if rx in (PDSH, COMPOSE) and hosts > max(2, hits // 2):
        enough = False  # a different "host" on every line: words (a table's rows), not hosts
    if not enough:
        return False, lines
    if rx is BRACKET:  # the first character of the message was part of the match
        prefix = prefix.str.slice(0, prefix.str.len_chars() - 1)
    return True, lines.str.slice(prefix.str.len_chars().fill_null(0))


def _is_host(token: str) -> bool:
    return bool(HOSTLIKE.match(token)) and not NOT_HOST.search(token)


def detect_prefixes(sample: Sequence[str | None] | pl.Series) -> FilePrefix:
    """Decide the per-file prefixes from a file's first SAMPLE_LINES lines (empty ones ignored)."""
    return detect(sample)[0]


def detect(sample: Sequence[str | None] | pl.Series) -> tuple[FilePrefix, WriterKey | None]:
    """The per-file prefixes of a sample and how to tell its lines' writers apart (see
    :class:`WriterKey`); one regex call on the common file that has neither."""
    lines = pl.Series("text", sample, dtype=pl.String).head(SAMPLE_LINES)
    lines = lines.filter(lines.str.len_bytes() > 0)
    if lines.len() == 0 or not lines.str.contains(_ANY_PREFIX).any():
        return NO_PREFIX, None  # the common answer, found with one regex
    prefix = NO_PREFIX
    if lines.str.contains(ANY_FILE_PREFIX).sum() >= MAJORITY * lines.len():
        quote, rest = _carried(lines, QUOTE)
        compose, rest = _carried(rest, COMPOSE)
        pdsh, rest = _carried(rest, PDSH)
        srun, rest = _carried(rest, SRUN_LABEL)
        bracket, rest = _carried(rest, BRACKET)
        prefix = FilePrefix(pdsh=pdsh, srun=srun, bracket=bracket, compose=compose, quote=quote)
    else:
        rest = lines
    width = _pytest_width(rest)
    if width:
        prefix = replace(prefix, pytest=width)
    return prefix, writer_key(lines, prefix)


def _pytest_width(lines: pl.Series) -> int:
    """How many spaces follow pytest's "E" in ``lines`` (its least: each exception has its own,
    and its message lines their own indentation after it); 0 when they are no pytest report
    (most lines "E" ones, or a pytest header, section or summary line among them)."""
    marked = lines.str.contains(PYTEST_E)
    hits = marked.sum()
    if hits < 2 or (hits < MAJORITY * lines.len()
                    and not lines.str.contains(PYTEST_MARK).any()):
        return 0
    width = lines.str.extract(r"^E( +)\S", 1).str.len_chars().min()
    return width if isinstance(width, int) else 1


# --- writers told apart in bulk ----------------------------------------------------------------
# The reader keeps each writer's last line (its last activity) without parsing every line: a
# regex names the leading writer prefixes of each line in polars, and only the last line of each
# name reaches parse_line. Stamps between the prefixes are skipped (they differ on every line);
# prefixes inside the message ("[Rank N]") are not read there.
_QUOTE_TOKEN = r"(?:(?:> ?)+|[ \t]+\| ?)"
_PYTEST_TOKEN = r"E +"
#: File prefixes that name no writer.
_NAMELESS = {_QUOTE_TOKEN, _PYTEST_TOKEN}
_FILE_TOKENS = (
    ("quote", _QUOTE_TOKEN),
    ("pytest", _PYTEST_TOKEN),
    ("compose", r"[A-Za-z0-9_.-]*[A-Za-z][A-Za-z0-9_.-]* +\| "),
    ("pdsh", r"[A-Za-z0-9][A-Za-z0-9_.-]*: "),
    ("srun", r" *[0-9]+: "),
    ("bracket", r"\[[0-9]+\]: ?"),
)
_LINE_TOKENS = (
    r"\[[A-Za-z_][A-Za-z0-9_-]*[0-9]+(?:[|:][0-9]+)?\]: ?",  # [default0]: [rank3]: [trainer0|5]:
    r"\[(?:rank: |RANK )[0-9]+\] ",  # Lightning, "[RANK 4] "
    r"\[[0-9]+,(?:mpirank:)?[0-9]+(?:,[A-Za-z0-9][A-Za-z0-9_.-]*)?\]<std[a-z]+>: ?",  # mpirun
    # Ray, vLLM
    r"\((?:[A-Za-z_][A-Za-z0-9_.:-]*,? )?(?:(?:rank=|TP)[0-9]+ )?pid=[0-9]+"
    r"(?:, ip=[0-9A-Fa-f.:]+)?\) ?",
    r"\[pod/[^\] ]+\] ?",  # kubectl
    r"(?:[0-9a-f]{8} )?\[rank=[0-9]+\] \|\| ?",  # Determined
)
_STAMP = (r"\[?[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?"
          r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?\]? +(?:[-|] +)?")
_ANY_TOKEN = "|".join(t for _, t in _FILE_TOKENS)
_ANY_LINE = "|".join(_LINE_TOKENS)
_ANY_PREFIX = f"^(?:{ANY_FILE_PREFIX[1:]}|(?:{_STAMP})?(?:{_ANY_TOKEN})*(?:{_ANY_LINE}))"
_WHICH = f"^(?:{_ANY_TOKEN})*({_STAMP})?(?:{_ANY_TOKEN})*({_ANY_LINE})"
#: After the prefixes, something must be written: a writer's blank lines are not its activity.
_WRITTEN = r"[ \t]*[^ \t\r]"


@dataclass(frozen=True)
class WriterKey:
    """A Rust regex whose capture groups, joined, name a line's writer prefixes (null: a blank
    line); ``groups`` is 1, or 2 when a stamp sits between them. ``width``, when known, is one
    more than the longest name a sample showed: the line's first ``width`` characters are a
    name too, finer (a few characters of the message come with it) and read far faster."""

    regex: str
    groups: int = 1
    width: int | None = None

    def exact(self, col: str = "text") -> pl.Expr:
        """The writer name of each line, as a polars expression."""
        text = pl.col(col)
        if self.groups == 1:
            return text.str.extract(self.regex, 1)
        parts = text.str.extract_groups(self.regex)
        return pl.concat_str([parts.struct.field("1"), parts.struct.field("2")],
                             separator="\x1f")

    def quick(self, col: str = "text") -> pl.Expr:
        """The finer name by ``width`` (the exact one without it)."""
        return self.exact(col) if self.width is None else pl.col(col).str.slice(0, self.width)


def writer_key(lines: pl.Series, prefix: FilePrefix) -> WriterKey | None:
    """How to name the writers of lines like ``lines`` (None: nothing in them names one)."""
    files = [t for name, t in _FILE_TOKENS if getattr(prefix, name)]
    if lines.len() == 0:
        named = not set(files) <= _NAMELESS
        return WriterKey(f"^((?:{'|'.join(files)})*){_WRITTEN}") if named else None
    which = lines.str.extract_groups(_WHICH).struct.unnest()
    which = which.filter(pl.col("2").is_not_null())
    toks = which["2"].unique().to_list()
    used = [t for t in _LINE_TOKENS if any(re.fullmatch(t, x) for x in toks)]
    if not used and set(files) <= _NAMELESS:  # every line quoted names no writer
        return None
    if which["1"].is_not_null().any():  # a stamp before the writer prefixes
        pre = f"((?:{'|'.join(files)})*)" if files else "()"
        return WriterKey(f"^{pre}(?:{_STAMP})?((?:{'|'.join(files + used)})*){_WRITTEN}", 2)
    key = WriterKey(f"^((?:{'|'.join(files + used)})*){_WRITTEN}")
    longest = lines.str.extract(key.regex, 1).str.len_chars().max()
    return WriterKey(key.regex, 1, longest + 1) if isinstance(longest, int) and longest else key


#: Lines of a later block sampled for writer prefixes its file's first block did not show.
BLOCK_SAMPLE = 500


def block_writers(sample: pl.Series, known: FilePrefix) -> WriterKey | None:
    """How to name the writers of a later block of a file whose prefixes are ``known``."""
    lines = sample.head(BLOCK_SAMPLE)
    if known == NO_PREFIX and not lines.str.contains(_ANY_PREFIX).any():
        return None
    return writer_key(lines, known)


#: Ray's log deduplication appends to a line that several workers printed " [repeated 6x across
#: cluster]" (ray/_private/ray_logging.py): not part of the message.
RAY_DEDUP = re.compile(r"\s+\[repeated \d+x across cluster\]\s*$")
#: A pasted line a bug report set in Markdown: bold ("**RuntimeError: ...**", "__...__") or
#: inline code ("`Exception: ...`"): the message is what is inside.
MARKUP = re.compile(r"^(?P<mark>\*\*|__|`{1,3})(?P<inner>[^\s*_`](?:.*[^\s*_`])?)(?P=mark)\s*$")


def nccl_device(text: str) -> int | None:
    """The CUDA device an NCCL_DEBUG line's "host:pid:tid [dev]" prefix names, if any.

    >>> nccl_device("gpu3:811:902 [1] NCCL INFO init.cc:840 -> 5"), nccl_device("boom")
    (1, None)
    """
    m = NCCL.match(strip_ansi(text))
    return int(m.group("dev")) if m and m.group("dev") is not None else None


def parse_line(text: str, ref: Reference | int, prefix: FilePrefix = NO_PREFIX) -> LineInfo:
    """Strip the known prefixes of ``text``; ``ref`` (or a year) fills in stamps with no year."""
    if isinstance(ref, int):
        ref = Reference(ref)
    info = LineInfo(body=text)
    parts: list[str] = []  # the stream's name, from prefixes only
    body = _file_prefixes(strip_ansi(text), prefix, info, parts)
    stamped = False  # a level word right after a stamp is the logger's level
    for _ in range(10):  # prefixes stack, but never deeper than this
        if stamped and (m := LEVEL.match(body)):
            info.level = info.level or LEVELS.get(m.group("level"))
            body = body[m.end() :]
            stamped = False
            continue
        if stamped and (m := CRI_STREAM.match(body)):
            body = body[m.end() :]
            stamped = False
            continue
        if stamped and body[:1] == "{" and (m := LOKI_LABELS.match(body)):
            body = body[m.end() :]
            stamped = False
            continue
        if stamped and "]: " in body[:100] and (m := SYSLOG_TAIL.match(body)):
            info.host = info.host or m.group("host")
            body = body[m.end() :]
            stamped = False
            continue
        if stamped and ">> " in body[:66] and (m := COLLECTOR_HOST.match(body)):
            info.host = info.host or m.group("host")
            parts.append(f"h={m.group('host')}")
            body = body[m.end() :]
            continue
        stamped = False
        m = LAUNCHER.match(body)
        if m and m.group("role").lower() != "rank":
            info.local_rank = int(m.group("lr"))
            parts.append(f"l={info.local_rank}")
            if m.group("gr") is not None and info.rank is None:
                info.rank, info.cue = int(m.group("gr")), "launcher prefix rank"
            body = body[m.end() :]
            continue
        m = ROLE_TEE.match(body) if body.startswith("[") else None
        if m and info.local_rank is None:
            info.local_rank = int(m.group("lr"))
            parts.append(f"l={info.local_rank}")
            body = body[m.end() :]
            continue
        m = TORCH_RANK.match(body) or LIGHTNING.match(body) or UPPER_RANK.match(body)
        if m:
            info.rank = int(m.group("rank"))
            info.cue = RANK_CUES[m.re.pattern]
            body = body[m.end() :]
            continue
        m = MPI.match(body)
        if m:
            if info.rank is None:
                info.rank, info.cue = int(m.group("rank")), "mpirun [job,rank] prefix"
            info.host = info.host or m.group("host")
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
            if m.re is PYLOG_BRACKET and m.group("level"):
                info.level = info.level or LEVELS.get(m.group("level"))
            body = body[m.end() :]
            stamped = True
            continue
        m = DEEPSPEED_SRC.match(body)
        if m:
            body = body[m.end() :]
            continue
        m = RANK_OF_WORLD.match(body) if body[:1] == "[" else None
        if m and int(m.group("rank")) < int(m.group("world")):
            if info.rank is None:
                info.rank, info.cue = int(m.group("rank")), "(rank/world) logger prefix"
            body = body[m.end() :]
            continue
        m = SYSLOG.match(body) if body[:1] in "ADFJMNOS" else None
        if m:
            info.host = info.host or m.group("host")
            mmdd = str(MONTHS[m.group("mon")] * 100 + int(m.group("day")))
            _stamp(info, timestamps.glog(mmdd, m.group("hms"), m.group("frac"), ref))
            body = body[m.end() :]
            continue
        m = PYLOG_PLAIN.match(body)
        if m:
            info.level = info.level or LEVELS.get(m.group("level"))
            body = body[m.end() :]
            continue
        m = LEVEL_FIRST.match(body)
        if m:
            info.level = info.level or LEVELS.get(m.group("level"))
            _stamp(info, timestamps.glog(str(int(m.group("mm")) * 100 + int(m.group("dd"))),
                                         m.group("hms"), m.group("frac"), ref))
            body = body[m.end() :]
            continue
        m = TIME_OF_DAY.match(body)
        if m:
            body = body[m.end() :]
            continue
        m = SGLANG_GROUPS.match(body) or SGLANG_SOURCE.match(body)
        if m:
            body = body[m.end() :]
            continue
        m = RAY.match(body)
        if m:
            if m.group("rank") is not None and info.rank is None:
                info.rank, info.cue = int(m.group("rank")), "worker prefix rank=N"
            info.pid = int(m.group("pid"))
            info.host = info.host or m.group("ip")
            parts.append(f"w={m.group('pid')}" + (f"@{m.group('ip')}" if m.group("ip") else ""))
            body = body[m.end() :]
            continue
        m = DETERMINED.match(body) if "||" in body[:30] else None
        if m:
            if m.group("rank") is not None and info.rank is None:
                info.rank, info.cue = int(m.group("rank")), "Determined [rank=N] prefix"
            body = body[m.end() :]
            continue
        m = KUBECTL.match(body)
        if m:
            info.host = info.host or m.group("pod")
            parts.append(f"pod={m.group('pod')}/{m.group('container') or ''}")
            body = body[m.end() :]
            continue
        labels = _labelled(body)
        if labels is not None:  # "12: [rank12]:", "node7: [default0]:" without the file's word:
            body = _file_prefixes(body, labels, info, parts)  # the next prefix vouches for them
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
    body = RAY_DEDUP.sub("", body)
    if body[:1] in "*_`" and body:
        m = MARKUP.match(body)
        body = m.group("inner") if m else body
    info.body = body
    info.stream = "|".join(parts) or None
    return info


_VOUCHES = re.compile(r"(?:\[[A-Za-z_][\w-]*?\d+(?:[|:]\d+)?\]:"
                      r"|\[\d+,(?:mpirank:)?\d+(?:,[\w.-]+)?\]<std|\[rank: \d+\] "
                      r"|[^\s:\[\]]+:\d+:\d+ (?:\[\d+\] )?.*?NCCL (?:INFO|WARN))")
_SRUN_ONLY = FilePrefix(srun=True)
_PDSH_SRUN = FilePrefix(pdsh=True, srun=True)


def _labelled(body: str) -> FilePrefix | None:
    """The labels (srun's task, pdsh's host) ``body`` starts with when a writer prefix follows
    them (``12: [rank12]:``, ``node7:  3: [default0]:``), read then on any line."""
    m = SRUN_LABEL.match(body)
    if m is not None:
        return _SRUN_ONLY if _VOUCHES.match(body, m.end()) else None
    m = PDSH.match(body)
    if m is None or not _is_host(m.group("host")):
        return None
    end = m.end()
    label = SRUN_LABEL.match(body[end:])
    if label is not None:
        end += label.end()
    return _PDSH_SRUN if _VOUCHES.match(body, end) else None


def _file_prefixes(text: str, prefix: FilePrefix, info: LineInfo, parts: list[str]) -> str:
    body = text
    if prefix.quote:
        m = QUOTE.match(body)
        body = body[m.end():] if m else body
    if prefix.compose:
        m = COMPOSE.match(body)
        if m:
            info.host = info.host or m.group("svc")
            parts.append(f"svc={m.group('svc')}")
            body = body[m.end() :]
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
    if prefix.pytest and body[:1] == "E" and body[1:2] in ("", " "):  # inside srun's label
        end = 1
        while end <= prefix.pytest and body[end: end + 1] == " ":
            end += 1
        body = body[end:]
    return body


def _stamp(info: LineInfo, stamp: timestamps.Stamp | None) -> None:
    if stamp is not None and info.ts is None:
        info.ts, info.clock = stamp.ts, stamp.clock
