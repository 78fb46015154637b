"""Per process group, the timeline of collectives across ranks: who never joined, where the
ranks first disagree, who lags, and where each rank's pending collective was called from.

"Which rank did not join which collective" is the question behind most hangs. PyTorch answers
it in several places; this module folds them into one :class:`GroupTimeline` per process group:

- Flight Recorder dumps (the ``collectives``, ``fr_dumps`` and ``fr_groups`` frames, see
  :mod:`~ddp_autopsy.analyzer.flight_recorder`): every rank's recent collectives with sequence
  numbers, shapes, dtypes, state and the Python call site; ``pg_status`` counters;
- log events: the NCCL watchdog's timeout (``watchdog_timeout``: op and sequence number per
  rank) and failure summary (``watchdog_summary``: last enqueued / completed per rank and PG;
  so does a rank's report of the dump signal another's timeout sent it, ``dump_signal``),
  the desync report (``desync_not_joined``, ``desync_never_joined``), DETAIL fingerprints
  (``collective_fingerprint_mismatch``) and monitored barriers (``monitored_barrier_failed``);
- stack dumps, to say where a rank that never joined is instead.

How a group is read. Every collective of a group carries a sequence number, the same on all
ranks. A rank's *last issued* number is the highest it recorded (or ``pg_status``'s last
enqueued). When ranks differ, the group is stuck at ``lowest + 1``: the ranks that issued it
wait in it, the ranks that did not *never joined* it. Where nobody is behind, the *pending*
collective is the oldest unfinished one. Independently, the *first divergence* is the lowest
sequence number at which the ranks' records disagree — operation, then sizes, then dtypes,
then the call site (the first user frame of the stack) — and the ranks off the majority are
its culprits. Sizes are not compared where they legitimately differ (all_to_all; the root of a
gather or scatter), and a state difference (completed here, scheduled there) is what a hang
looks like, not a disagreement.

What "finished" means depends on the backend: NCCL tracks ``state`` from CUDA events; Gloo
leaves ``state`` at ``scheduled`` and marks finished work ``retired``.

Entry points: :func:`analyze` (a Job; cached on it) and :func:`analyze_frames` (frames only,
for scripts and benchmarks).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from ddp_autopsy.analyzer.flight_recorder import FRFrames
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.analyzer.ranksets import rank_phrase

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job

#: Operations whose sizes legitimately differ between ranks (compare op and dtypes only).
UNEVEN_SIZES = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base",
                          "_alltoall_base", "all_to_all_v", "coalesced", "gather", "scatter",
                          "_reduce_scatter_base_uneven", "allgather_into_tensor_coalesced",
                          "reduce_scatter_tensor_coalesced"})
#: A group is called stuck when its pending collective is at least this old at dump time.
STALE_S = 30.0
#: A rank that entered the pending collective this much later than the median is a straggler
#: (or half the collective's timeout, when that is shorter).
STRAGGLER_S = 60.0
#: Log events that say collectives were failing (the job was stuck, not just dumped mid-run).
HANG_KINDS = kinds_tagged("hang")
LOG_KINDS = (*HANG_KINDS, *kinds_tagged("mismatch"), "dump_signal")
#: ``[PG 1 Rank 0]`` (≈2.2-2.4) and ``[PG ID 1 PG GUID 1(desc) Rank 1]`` (≈2.5+) prefixes.
PG_PREFIX = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>[^\s(\]]+)"
                       r"(?:\((?P<desc>[^)]*)\))?)? Rank (?P<rank>\d+)\]")


@dataclass(frozen=True)
class Call:
    """One rank's record of one collective (a Flight Recorder entry)."""

    rank: int
    seq: int
    op: str | None
    input_sizes: str | None = None
    input_dtypes: str | None = None
    output_sizes: str | None = None
    output_dtypes: str | None = None
    state: str | None = None
    finished: bool = False
    time_created: datetime | None = None
    timeout_ms: int | None = None
    api: str | None = None
    site_func: str | None = None
    site_file: str | None = None
    site_line: int | None = None
    source: str | None = None
    host: str | None = None

    @property
    def site(self) -> str | None:
        """The user's call site: ``train_step (train.py:85)`` (the file name only)."""
        if not self.site_func and not self.site_file:
            return None
        name = (self.site_file or "?").replace("\\", "/").rsplit("/", 1)[-1]
        return f"{self.site_func} ({name}:{self.site_line})"

    @property
    def site_path(self) -> str | None:
        """The call site with the file's full path, as recorded."""
        if not self.site_func and not self.site_file:
            return None
        return f"{self.site_func} ({self.site_file}:{self.site_line})"

    @property
    def shape(self) -> str:
        """``all_reduce [[1]] Float``."""
        parts = [self.op or "?"]
        if self.input_sizes is not None:
            parts.append(self.input_sizes)
        if self.input_dtypes:
            parts.append(self.input_dtypes)
        return " ".join(parts)

    def describe(self) -> str:
        """``#9 all_reduce [[1]] Float, scheduled, from main (train.py:85)``."""
        out = f"#{self.seq} {self.shape}"
        if self.state:
            out += f", {self.state}"
        if self.site:
            out += f", from {self.site}"
        return out


@dataclass
class RankState:
    """Where one rank is in one process group."""

    rank: int
    has_dump: bool = False
    last_issued: int | None = None  # highest sequence number it issued
    last_completed: int | None = None  # highest it finished (pg_status, states, logs)
    pending: Call | None = None  # its oldest unfinished collective
    last: Call | None = None  # its newest collective
    source: str | None = None  # the dump it comes from
    host: str | None = None
    timed_out_at: int | None = None  # sequence number a watchdog timeout named (logs)
    timed_out_op: str | None = None


@dataclass
class Divergence:
    """The first collective the ranks of a group disagree about."""

    seq: int
    aspect: str  # op | sizes | dtypes | call site
    calls: dict[int, Call]
    culprits: list[int]
    majority: bool  # False: a tie, every rank is named
    #: From here on the culprit's collectives are the others' shifted by this many: +1, it
    #: skipped one (its #n is their #n+1); -1, it issued an extra one. None: no such pattern.
    shift: int | None = None

    def value(self, call: Call) -> str:
        """What this call did, in the aspect the ranks disagree on (for display)."""
        return _aspect_value(call, self.aspect, exact=False) or "?"

    def summary(self) -> tuple[str, str | None]:
        """(what the culprits did, what the others did)."""
        odd = sorted({self.value(self.calls[r]) for r in self.culprits})
        others = sorted({self.value(c) for r, c in self.calls.items() if r not in self.culprits})
        return ", ".join(odd), (", ".join(others) if others else None)


@dataclass
class GroupTimeline:
    """One process group across ranks (see the module docstring)."""

    name: str
    desc: str | None = None
    pg_id: int | None = None
    members: list[int] = field(default_factory=list)
    members_from: str = "dumps"  # pg_config | world | dumps | logs
    ranks: dict[int, RankState] = field(default_factory=dict)
    stuck_at: int | None = None  # the collective the group waits in
    stuck_call: Call | None = None  # the majority's record of it
    waiting: list[int] = field(default_factory=list)  # issued stuck_at, not finished
    not_joined: dict[int, int] = field(default_factory=dict)  # rank → its last issued seq
    no_dump: list[int] = field(default_factory=list)  # members without a usable dump
    never_joined_any: list[int] = field(default_factory=list)  # a dump, no entry of this group
    divergence: Divergence | None = None
    laggards: list[int] = field(default_factory=list)
    late: dict[int, float] = field(default_factory=dict)  # rank → seconds after the median
    fr: bool = False  # Flight Recorder data covers this group
    log_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``process group 0 (default_pg)``."""
        return f"process group {self.name}" + (f" ({self.desc})" if self.desc else "")

    def calls_at(self, seq: int) -> dict[int, Call]:
        return self._calls.get(seq, {})

    _calls: dict[int, dict[int, Call]] = field(default_factory=dict, repr=False)

    def state_rows(self, limit: int = 40) -> tuple[list[dict[str, str]], int]:
        """Ranks grouped by identical state (``who``, ``mark``, ``issued``, ``completed``,
        ``pending``), largest groups first; and how many groups were left out."""
        groups: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
        culprits = set(self.divergence.culprits) if self.divergence else set()
        for r in self.members or sorted(self.ranks):
            st = self.ranks.get(r)
            if r in self.no_dump or st is None:
                key = ("no dump", "", "", "")
            else:
                mark = ("never joined" if r in self.not_joined else
                        "waiting" if r in self.waiting else "")
                if r in culprits:
                    mark = f"diverged at #{self.divergence.seq}" + (  # type: ignore[union-attr]
                        f", {mark}" if mark else "")
                if r in self.late:
                    mark = (mark + ", " if mark else "") + f"{self.late[r]:.0f} s late"
                pending = st.pending.describe() if st.pending else (
                    f"none (last: {st.last.describe()})" if st.last else "")
                key = (mark, _num(st.last_issued), _num(st.last_completed), pending)
            groups[key].append(r)
        ordered = sorted(groups.items(), key=lambda kv: (kv[0][0] == "", -len(kv[1]), kv[1][0]))
        rows = [{"who": rank_list(rs), "count": str(len(rs)), "mark": k[0], "issued": k[1],
                 "completed": k[2], "pending": k[3]} for k, rs in ordered[:limit]]
        return rows, max(0, len(ordered) - limit)

    def to_dict(self) -> dict[str, Any]:
        """For the HTML report and JSON details."""
        return {
            "name": self.name, "desc": self.desc, "members": self.members,
            "members_from": self.members_from, "stuck_at": self.stuck_at,
            "stuck_call": self.stuck_call.describe() if self.stuck_call else None,
            "waiting": self.waiting, "not_joined": {str(k): v for k, v in self.not_joined.items()},
            "no_dump": self.no_dump, "never_joined_any": self.never_joined_any,
            "laggards": self.laggards,
            "late": {str(k): round(v, 1) for k, v in self.late.items()},
            "divergence": None if self.divergence is None else {
                "seq": self.divergence.seq, "aspect": self.divergence.aspect,
                "culprits": self.divergence.culprits,
                "calls": {str(r): c.describe() for r, c in self.divergence.calls.items()}},
            "ranks": [{
                "rank": s.rank, "dump": s.has_dump, "last_issued": s.last_issued,
                "last_completed": s.last_completed,
                "pending": s.pending.describe() if s.pending else None,
                "last": s.last.describe() if s.last else None,
            } for s in sorted(self.ranks.values(), key=lambda s: s.rank)],
        }


@dataclass
class CollectiveReport:
    """Every process group's timeline, and whether the job looked stuck."""

    groups: list[GroupTimeline] = field(default_factory=list)
    #: Why we believe collectives were stuck (empty: the dumps may be a healthy snapshot).
    stuck_because: list[str] = field(default_factory=list)
    dumps: pl.DataFrame = field(default_factory=pl.DataFrame)

    @property
    def stuck(self) -> bool:
        return bool(self.stuck_because)

    def group(self, name: str) -> GroupTimeline | None:
        return next((g for g in self.groups if g.name == name), None)


# --------------------------------------------------------------------------- entry points


def analyze(job: Job) -> CollectiveReport:
    """The report of a :class:`~ddp_autopsy.analyzer.job.Job` (its ``collective_report``
    fact: built once per job)."""
    return job.collective_report


def build_report(job: Job) -> CollectiveReport:
    """Build the report (the ``collective_report`` fact's builder; call :func:`analyze`)."""
    frames = FRFrames(collectives=job.collectives, dumps=job.fr_dumps, groups=job.fr_groups)
    waiting: set[int] = set()
    if job.stacks.height:
        tree = job.stack_tree
        waiting = {p.rank for c in tree.classes if c.collective is not None
                   for p in tree.members(c.members) if p.rank is not None}
    return analyze_frames(frames, events=job.active_events, world_size=job.world_size,
                          stacks_waiting=waiting)


def analyze_frames(frames: FRFrames, *, events: pl.DataFrame | None = None,
                   world_size: int | None = None,
                   stacks_waiting: Iterable[int] = ()) -> CollectiveReport:
    """Build every group's timeline from Flight Recorder frames and (optionally) log events."""
    report = CollectiveReport(dumps=frames.dumps)
    log_rows = _log_rows(events)
    coll = _prepare(frames.collectives)
    dumped = _dumped_ranks(frames.dumps)
    groups: dict[str, GroupTimeline] = {}
    if coll.height:
        _fr_groups(coll, frames, dumped, world_size, groups)
    _fold_logs(log_rows, groups, world_size)
    report.groups = sorted(groups.values(), key=lambda g: (g.name != "0", _natural(g.name)))
    _stuck_evidence(report, coll, frames, log_rows, set(stacks_waiting))
    return report


def _num(v: int | None) -> str:
    return "" if v is None or v < 0 else f"#{v}"


def _natural(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _dumped_ranks(dumps: pl.DataFrame) -> dict[int, str]:
    """Ranks with a usable dump → status of their dump (``ok``, or why it is unusable)."""
    out: dict[int, str] = {}
    if dumps.height == 0 or "rank" not in dumps.columns:
        return out
    for rank, status in dumps.select("rank", "status").drop_nulls("rank").iter_rows():
        if status != "duplicate" and (rank not in out or status == "ok"):
            out[rank] = status
    return out


# --------------------------------------------------------------------------- Flight Recorder


def _prepare(coll: pl.DataFrame) -> pl.DataFrame:
    """Collective (not p2p) entries of known ranks, with their group key ``_g``, whether the
    rank's dump tracks completion (``_tracks``: NCCL events) and whether each is ``_finished``
    (tracked: state ``completed``; Gloo: ``retired``)."""
    if coll.height == 0:
        return coll
    keep = (pl.col("rank").is_not_null() & pl.col("collective_seq_id").is_not_null()
            & ~pl.col("is_p2p").fill_null(False))
    if coll.select(keep.sum()).item() < coll.height:  # filtering copies every column
        coll = coll.filter(keep)
    tracking = coll.select(pl.col("rank").filter(pl.col("state").is_in(["started", "completed"]))
                           .unique())["rank"]
    tracks = pl.col("rank").is_in(tracking.to_list())
    group = pl.col("pg_name") if coll["pg_name"].null_count() == 0 else pl.coalesce(
        "pg_name", pl.format("id{}", pl.col("pg_id").cast(pl.String)), pl.lit("?"))
    return coll.with_columns(
        group.alias("_g"),
        tracks.alias("_tracks"),
        pl.when(tracks).then(pl.col("state") == "completed")
        .otherwise(pl.col("retired").fill_null(False)).alias("_finished"),
    )


def _fr_groups(coll: pl.DataFrame, frames: FRFrames, dumped: dict[int, str],
               world_size: int | None, groups: dict[str, GroupTimeline]) -> None:
    status = _status_by_group(frames.groups)
    config = _config_by_group(frames.groups)
    max_rank = max([*dumped, coll["rank"].max()], default=-1)  # type: ignore[type-var]
    world = max(world_size or 0, max_rank + 1)

    # One group (the usual case): grouping by rank alone is ~2x faster than by (name, rank).
    single = bool((coll["_g"] == coll["_g"][0]).all())
    per_rank = coll.select("_g", "rank", "collective_seq_id", "_finished", "source", "host",
                           "pg_desc", "pg_id").group_by(["rank"] if single else ["_g", "rank"]).agg(
        pl.col("collective_seq_id").max().alias("last_issued"),
        pl.col("collective_seq_id").filter(pl.col("_finished")).max().alias("last_finished"),
        pl.col("collective_seq_id").filter(~pl.col("_finished")).min().alias("first_pending"),
        pl.col("source").first(), pl.col("host").drop_nulls().first(),
        pl.col("pg_desc").drop_nulls().first().alias("desc"),
        pl.col("pg_id").drop_nulls().first().alias("pg_id"),
    )
    if single:
        per_rank = per_rank.with_columns(pl.lit(coll["_g"][0], pl.String).alias("_g"))
    for gname, sub in per_rank.group_by("_g", maintain_order=True):
        name = str(gname[0])
        desc = next((d for d in sub["desc"].to_list() if d), None)
        pg_id = next((p for p in sub["pg_id"].to_list() if p is not None), None)
        g = GroupTimeline(name=name, desc=desc, pg_id=pg_id, fr=True)
        members = config.get(name)
        if members:
            g.members, g.members_from = sorted(set(members)), "pg_config"
        elif desc == "default_pg" or (name == "0" and desc in (None, "", "undefined")):
            g.members, g.members_from = list(range(world)), "world"
        else:
            g.members, g.members_from = sorted(sub["rank"].to_list()), "dumps"
        for row in sub.iter_rows(named=True):
            st = RankState(rank=row["rank"], has_dump=True, last_issued=row["last_issued"],
                           last_completed=row["last_finished"], source=row["source"],
                           host=row["host"])
            counters = status.get((name, row["rank"]))
            if counters:
                enq, done = counters
                if enq is not None and enq >= 0:
                    st.last_issued = max(st.last_issued or 0, enq)
                if done is not None and done >= 0:
                    st.last_completed = max(st.last_completed or 0, done)
            g.ranks[st.rank] = st
        for r in g.members:
            if r not in g.ranks:
                if dumped.get(r) == "ok":
                    g.ranks[r] = RankState(rank=r, has_dump=True)
                    g.never_joined_any.append(r)
                else:
                    g.no_dump.append(r)
        groups[name] = g
    _frontier(coll, groups, per_rank)
    _divergence(coll, groups)


def _status_by_group(groups: pl.DataFrame) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    if groups.height == 0:
        return out
    for name, rank, enqueued, completed in groups.filter(
            pl.col("pg_name").is_not_null() & pl.col("rank").is_not_null()).select(
            "pg_name", "rank", "last_enqueued", "last_completed").iter_rows():
        out[(name, rank)] = (enqueued, completed)
    return out


def _config_by_group(groups: pl.DataFrame) -> dict[str, list[int]]:
    """Membership per group name: what most ranks' ``pg_config`` say."""
    out: dict[str, list[int]] = {}
    if groups.height == 0:
        return out
    rows = groups.filter(pl.col("pg_name").is_not_null() & pl.col("members").is_not_null()
                         & (pl.col("members").list.len() > 0)).select("pg_name", "members")
    # Usually every rank's pg_config says the same: checked in polars (4,096 ranks: 4,096
    # lists of 4,096 members, too many to turn into Python objects or hash).
    agree = rows.group_by("pg_name", maintain_order=True).agg(
        (pl.col("members") == pl.col("members").first()).all().alias("same"),
        pl.col("members").first())
    for name, same, members in agree.iter_rows():
        if same:
            out[name] = members
            continue
        votes: Counter[tuple[int, ...]] = Counter()
        for (m,) in rows.filter(pl.col("pg_name") == name).select("members").iter_rows():
            votes[tuple(m)] += 1
        out[name] = list(votes.most_common(1)[0][0])
    return out


#: What :func:`_call` reads (rows are converted to Python with only these columns).
_CALL_COLUMNS = ("_g", "rank", "collective_seq_id", "op", "input_sizes", "input_dtypes",
                 "output_sizes", "output_dtypes", "state", "_tracks", "_finished",
                 "time_created", "timeout_ms", "api", "site_func", "site_file", "site_line",
                 "source", "host")


def _call(row: dict[str, Any]) -> Call:
    finished = bool(row["_finished"])
    # Gloo leaves every state at "scheduled": say what we know (finished or not) instead.
    state = row["state"] if row["_tracks"] else ("finished" if finished else "not finished")
    return Call(
        rank=row["rank"], seq=row["collective_seq_id"], op=row["op"],
        input_sizes=row["input_sizes"], input_dtypes=row["input_dtypes"],
        output_sizes=row["output_sizes"], output_dtypes=row["output_dtypes"],
        state=state, finished=finished, time_created=row["time_created"],
        timeout_ms=row["timeout_ms"], api=row["api"], site_func=row["site_func"],
        site_file=row["site_file"], site_line=row["site_line"], source=row["source"],
        host=row["host"])


def _frontier(coll: pl.DataFrame, groups: dict[str, GroupTimeline],
              per_rank: pl.DataFrame) -> None:
    """Stuck collective, waiting and never-joined ranks, pending and last calls, laggards."""
    wanted: dict[str, set[int]] = {}
    for g in groups.values():
        issued = {r: s.last_issued for r, s in g.ranks.items()
                  if s.has_dump and s.last_issued is not None}
        if not issued:
            continue
        lo, hi = min(issued.values()), max(issued.values())
        if hi > lo:
            g.stuck_at = lo + 1
            g.not_joined = {r: e for r, e in issued.items() if e < g.stuck_at}
            g.waiting = sorted(r for r, e in issued.items() if e >= g.stuck_at)
            for r in g.never_joined_any:
                g.not_joined.setdefault(r, 0)
        else:
            pend = [s.last_completed for s in g.ranks.values()
                    if s.has_dump and s.last_issued is not None
                    and (s.last_completed is None or s.last_completed < s.last_issued)]
            if pend:
                g.stuck_at = min((p if p is not None else lo - 1) for p in pend) + 1
                g.waiting = sorted(r for r, e in issued.items() if e >= g.stuck_at)
        completed = {r: s.last_completed for r, s in g.ranks.items()
                     if s.has_dump and s.last_completed is not None}
        if completed and min(completed.values()) < max(completed.values()):
            low = min(completed.values())
            g.laggards = sorted(r for r, c in completed.items() if c == low)
        elif g.not_joined:
            g.laggards = sorted(g.not_joined)
        want = {s.last_issued for s in g.ranks.values() if s.last_issued is not None}
        if g.stuck_at is not None:
            want.add(g.stuck_at)
        wanted[g.name] = {w for w in want if w is not None}
    # Pending (oldest unfinished) and last calls per rank, and every call at the stuck seq; the
    # few sequence numbers involved are picked out first (joining all entries is ~20x slower).
    marks = per_rank.select("_g", "rank", pl.col("last_issued").alias("_last"),
                            pl.col("first_pending").alias("_pend"))
    seqs = {*marks["_last"].drop_nulls(), *marks["_pend"].drop_nulls(),
            *(s for w in wanted.values() for s in w)}
    near = coll.filter(pl.col("collective_seq_id").is_in(sorted(seqs))) \
        .select(*_CALL_COLUMNS, "record_id")
    pend = (near.join(marks.drop_nulls("_pend"), left_on=["_g", "rank", "collective_seq_id"],
                      right_on=["_g", "rank", "_pend"]).filter(~pl.col("_finished"))
            .sort("record_id").unique(["_g", "rank"], keep="first"))
    last = (near.join(marks, left_on=["_g", "rank", "collective_seq_id"],
                      right_on=["_g", "rank", "_last"])
            .sort("record_id").unique(["_g", "rank"], keep="last"))
    for row in pend.iter_rows(named=True):
        g = groups.get(row["_g"])
        if g and row["rank"] in g.ranks:
            g.ranks[row["rank"]].pending = _call(row)
    for row in last.iter_rows(named=True):
        g = groups.get(row["_g"])
        if g and row["rank"] in g.ranks:
            g.ranks[row["rank"]].last = _call(row)
    keys = pl.DataFrame([(n, s) for n, seqs in wanted.items() for s in seqs],
                        schema={"_g": pl.String, "collective_seq_id": pl.Int64}, orient="row")
    at = near.join(keys, on=["_g", "collective_seq_id"], how="semi")
    for row in at.iter_rows(named=True):
        g = groups[row["_g"]]
        g._calls.setdefault(row["collective_seq_id"], {})[row["rank"]] = _call(row)
    for g in groups.values():
        if g.stuck_at is None:
            continue
        calls = g.calls_at(g.stuck_at)
        if calls:
            shapes = Counter((c.shape, c.site) for c in calls.values())
            top = shapes.most_common(1)[0][0]
            g.stuck_call = next(c for c in calls.values() if (c.shape, c.site) == top)
            g.late = _late(calls)


def _late(calls: dict[int, Call]) -> dict[int, float]:
    """Ranks that entered a collective much later than the median rank."""
    stamps = sorted(c.time_created for c in calls.values() if c.time_created is not None)
    if len(stamps) < 3:
        return {}
    median = stamps[len(stamps) // 2]
    out = {}
    for r, c in calls.items():
        if c.time_created is None:
            continue
        delay = (c.time_created - median).total_seconds()
        limit = STRAGGLER_S
        if c.timeout_ms:
            limit = min(limit, c.timeout_ms / 2000)
        if delay >= max(limit, 1.0):
            out[r] = delay
    return out


def _aspect_value(call: Call, aspect: str, *, exact: bool = True) -> str | None:
    if aspect == "op":
        return call.op
    if aspect == "sizes":
        if call.input_sizes == call.output_sizes:
            return f"{call.op} of {call.input_sizes}"
        return f"{call.op} of {call.input_sizes} into {call.output_sizes}"
    if aspect == "dtypes":
        if call.input_dtypes == call.output_dtypes:
            return f"{call.op} of {call.input_dtypes}"
        return f"{call.op} of {call.input_dtypes} into {call.output_dtypes}"
    return call.site_path if exact else call.site


_ASPECTS = ("op", "sizes", "dtypes", "call site")


def _sizes_may_differ() -> pl.Expr:
    """Ops whose ranks legitimately pass different sizes (see ``UNEVEN_SIZES``)."""
    return pl.col("op").is_in(list(UNEVEN_SIZES)).fill_null(False)


def _aspect_hashes() -> list[pl.Expr]:
    """One 64-bit hash per aspect of a record (sizes: 0 where they may differ)."""
    return [
        pl.col("op").hash().alias("op"),
        pl.when(_sizes_may_differ()).then(pl.lit(0, pl.UInt64))
        .otherwise(pl.struct("input_sizes", "output_sizes").hash()).alias("sizes"),
        pl.struct("input_dtypes", "output_dtypes").hash().alias("dtypes"),
        pl.struct("site_file", "site_line").hash().alias("call site"),
    ]


def _divergence(coll: pl.DataFrame, groups: dict[str, GroupTimeline]) -> None:
    """First sequence number per group where the ranks' records disagree (vectorised)."""
    # Two hashes per record — what ranks must agree on (op, sizes, dtypes), and the call site —
    # then "does it vary within the collective" per group; the aspect is looked up only at the
    # first collective that varies.
    even = ~_sizes_may_differ()
    hashed = coll.select(
        "_g", "collective_seq_id",
        pl.struct("op", pl.when(even).then(pl.col("input_sizes")).alias("i"),
                  pl.when(even).then(pl.col("output_sizes")).alias("o"),
                  "input_dtypes", "output_dtypes").hash().alias("_same"),
        pl.struct("site_file", "site_line").hash().alias("call site"),
        pl.col("site_line").is_null().alias("_site_null"))
    aggs = [pl.len().alias("n"),
            (pl.col("_same").min() != pl.col("_same").max()).alias("v_same"),
            (pl.col("call site").min() != pl.col("call site").max()).alias("v_site"),
            pl.col("_site_null").sum().alias("site_nulls")]
    if len(groups) == 1:  # the usual case: an integer key groups ~2x faster than (name, number)
        per_seq = hashed.group_by("collective_seq_id").agg(*aggs) \
            .with_columns(pl.lit(next(iter(groups)), pl.String).alias("_g"))
    else:
        per_seq = hashed.group_by("_g", "collective_seq_id").agg(*aggs)
    per_seq = per_seq.filter(pl.col("n") >= 2)
    differs = per_seq.filter(pl.col("v_same") | (pl.col("v_site") & (pl.col("site_nulls") == 0)))
    if differs.height == 0:
        return
    first = differs.sort("collective_seq_id").group_by("_g").first()
    for row in first.iter_rows(named=True):
        g = groups.get(row["_g"])
        if g is None:
            continue
        seq = row["collective_seq_id"]
        rows = coll.filter((pl.col("_g") == row["_g"]) & (pl.col("collective_seq_id") == seq))
        varies = rows.select((h.min() != h.max()) for h in _aspect_hashes()).row(0, named=True)
        aspect = next((a for a in _ASPECTS if varies[a]), "call site")
        calls = {r["rank"]: _call(r) for r in rows.select(_CALL_COLUMNS).iter_rows(named=True)}
        values = {r: _aspect_value(c, aspect) or "?" for r, c in calls.items()}
        counts = Counter(values.values())
        (top, n), *rest = counts.most_common()
        majority = not (rest and rest[0][1] == n)
        culprits = sorted(r for r, v in values.items() if v != top) if majority \
            else sorted(values)
        g.divergence = Divergence(seq=seq, aspect=aspect, calls=calls, culprits=culprits,
                                  majority=majority)
        if majority:
            g.divergence.shift = _shift(coll, row["_g"], seq, culprits[0],
                                        next(r for r in sorted(calls) if r not in culprits))
        g._calls.setdefault(seq, {}).update(calls)


SHIFT_WINDOW = 8


def _shift(coll: pl.DataFrame, group: str, seq: int, culprit: int, other: int) -> int | None:
    """Whether, from ``seq`` on, the culprit's collectives equal ``other``'s shifted by ±1 or ±2
    (the signature of a skipped or an extra collective), comparing op, sizes, dtypes and call
    site over up to ``SHIFT_WINDOW`` collectives."""
    rows = coll.filter((pl.col("_g") == group) & pl.col("rank").is_in([culprit, other])
                       & pl.col("collective_seq_id").is_between(seq - 2, seq + SHIFT_WINDOW + 2))
    seqs: dict[int, dict[int, tuple[Any, ...]]] = {culprit: {}, other: {}}
    for r in rows.select("rank", "collective_seq_id", "op", "input_sizes", "input_dtypes",
                         "site_file", "site_line").iter_rows():
        seqs[r[0]].setdefault(r[1], r[2:])
    mine, theirs = seqs[culprit], seqs[other]
    for k in (1, -1, 2, -2):
        pairs = [(mine[s], theirs[s + k]) for s in range(seq, seq + SHIFT_WINDOW)
                 if s in mine and s + k in theirs]
        if len(pairs) >= 2 and all(a == b for a, b in pairs):
            return k
    return None


# --------------------------------------------------------------------------- logs


def _log_rows(events: pl.DataFrame | None) -> list[dict[str, Any]]:
    if events is None or events.height == 0 or "kind" not in events.columns:
        return []
    out = []
    rows = list(events.filter(pl.col("kind").is_in(list(LOG_KINDS))).iter_rows(named=True))
    # (the rows' data decoded in one call: one json.loads per row is most of the cost here)
    datas = json.loads("[" + ",".join(r["data"] or "{}" for r in rows) + "]")
    for row, data in zip(rows, datas, strict=True):
        row["data"] = data
        m = PG_PREFIX.search(row.get("text") or "")
        row["pg"] = m.group("guid") or m.group("pg") if m else None
        row["pg_id"] = int(m.group("pg")) if m else None
        row["pg_desc"] = m.group("desc") if m else None
        if row.get("rank") is None and m:
            row["rank"] = int(m.group("rank"))
        out.append(row)
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text or "")]


def _fold_logs(rows: list[dict[str, Any]], groups: dict[str, GroupTimeline],
               world_size: int | None) -> None:
    """Add what the logs say per group: counters, timeouts, ranks named as not joined.

    Lines with a ``[PG ...]`` prefix go to that group (by GUID, then by id); lines without one
    (the desync report, monitored barriers) to the group that timed out at the collective they
    name, else to the default group.
    """
    if not rows:
        return
    by_id = {g.pg_id: g for g in groups.values() if g.pg_id is not None}
    for row in sorted(rows, key=lambda r: r["pg"] is None):  # prefixed lines first
        g = groups.get(row["pg"]) if row["pg"] is not None else None
        if g is None and row["pg_id"] is not None:
            g = by_id.get(row["pg_id"])
        if g is None and row["pg"] is None:
            g = _group_for_unprefixed(row, groups)
        if g is None:
            name = row["pg"] or "0"
            g = groups.setdefault(name, GroupTimeline(name=name, desc=row["pg_desc"],
                                                      pg_id=row["pg_id"], members_from="logs"))
            if name == "0" and world_size and not g.members:
                g.members, g.members_from = list(range(world_size)), "world"
            if row["pg_id"] is not None:
                by_id.setdefault(row["pg_id"], g)
        g.log_rows.append(row)
        if g.fr:
            continue  # Flight Recorder data is the finer record; logs are evidence only
        _apply_log_row(g, row)
    for g in groups.values():
        g.log_rows.sort(key=lambda r: (r["source"], r["line"]))
        if not g.fr:
            _log_frontier(g)


def _group_for_unprefixed(row: dict[str, Any],
                          groups: dict[str, GroupTimeline]) -> GroupTimeline | None:
    seq = row["data"].get("seq")
    if seq is not None:
        for g in groups.values():
            if g.stuck_at == seq or any(s.timed_out_at == seq for s in g.ranks.values()):
                return g
    # (one group named in the logs, no default one: the unprefixed line is that group's, as
    # when a rank's own "[PG 1 Rank 1] ..." line was cut before its numbers)
    return groups.get("0") or next((g for g in groups.values() if g.desc == "default_pg"),
                                   None) or (next(iter(groups.values())) if len(groups) == 1
                                             else None)


def _completed(d: dict[str, Any]) -> int:
    """A watchdog report's last completed work, -1 when none: a number past the last enqueued
    one and beyond any real count is the counter before any work completed (torch 2.3 printed
    it uninitialized: "last enqueued NCCL work: 1, last completed NCCL work: 76280750235782912";
    since 2.5 a group mixing point-to-point ops and collectives may count past it for real)."""
    done = d.get("completed", -1)
    return -1 if d.get("enqueued") is not None and done > max(d["enqueued"], 2**32) else done


def _apply_log_row(g: GroupTimeline, row: dict[str, Any]) -> None:
    d, rank, kind = row["data"], row.get("rank"), row["kind"]
    if kind == "watchdog_summary" and rank is not None:
        st = g.ranks.setdefault(rank, RankState(rank=rank))
        st.last_issued = max(st.last_issued or -1, d.get("enqueued", -1))
        st.last_completed = max(st.last_completed or -1, _completed(d))
        st.timed_out_at = d.get("seq", st.timed_out_at)
    elif kind == "watchdog_timeout":
        rank = rank if rank is not None else d.get("pgrank")
        if rank is None:
            return
        st = g.ranks.setdefault(rank, RankState(rank=rank))
        st.timed_out_at, st.timed_out_op = d.get("seq"), d.get("op")
    elif kind == "dump_signal" and rank is not None and d.get("enqueued") is not None:
        # a rank asked to dump after another's timeout says how far it had got (2.5+: "Last
        # enqueued NCCL work: 77, last completed NCCL work: 77")
        st = g.ranks.setdefault(rank, RankState(rank=rank))
        st.last_issued = max(st.last_issued or -1, d["enqueued"])
        st.last_completed = max(st.last_completed or -1, _completed(d))
    elif kind == "desync_not_joined":
        for r in _ints(d.get("ranks", "")):
            st = g.ranks.setdefault(r, RankState(rank=r))
            st.last_issued = d.get("done", st.last_issued)
            st.last_completed = d.get("done", st.last_completed)
            g.not_joined[r] = d.get("done", 0)
            if d.get("seq"):
                g.stuck_at = d["seq"]
    elif kind == "desync_never_joined":
        for r in _ints(d.get("ranks", "")):
            g.not_joined.setdefault(r, 0)
            if r not in g.never_joined_any:
                g.never_joined_any.append(r)


def _log_frontier(g: GroupTimeline) -> None:
    """Stuck collective and laggards from watchdog counters (no Flight Recorder)."""
    issued = {r: s.last_issued for r, s in g.ranks.items()
              if s.last_issued is not None and s.last_issued >= 0}
    timed = {r: s.timed_out_at for r, s in g.ranks.items() if s.timed_out_at is not None}
    if g.stuck_at is None and timed:
        g.stuck_at = Counter(timed.values()).most_common(1)[0][0]
    if g.stuck_at is not None:
        g.waiting = sorted(set(g.waiting) | {r for r, e in issued.items() if e >= g.stuck_at}
                           | {r for r, t in timed.items() if t == g.stuck_at})
        for r, e in issued.items():
            if e < g.stuck_at and r not in timed:
                g.not_joined.setdefault(r, e)
    completed = {r: s.last_completed for r, s in g.ranks.items()
                 if s.last_completed is not None and s.last_completed >= 0}
    if completed and min(completed.values()) < max(completed.values()):
        low = min(completed.values())
        g.laggards = sorted(r for r, c in completed.items() if c == low)
    elif g.not_joined:
        g.laggards = sorted(g.not_joined)
    if not g.members:
        g.members = sorted(g.ranks)


# --------------------------------------------------------------------------- stuck or not


def _stuck_evidence(report: CollectiveReport, coll: pl.DataFrame, frames: FRFrames,
                    log_rows: list[dict[str, Any]], stacks_waiting: set[int]) -> None:
    why = report.stuck_because
    hang_logs = [r for r in log_rows if r["kind"] in HANG_KINDS]
    if hang_logs:
        kinds = sorted({r["kind"] for r in hang_logs})
        why.append(f"the logs report failing collectives ({', '.join(kinds)})")
    if stacks_waiting:
        why.append(f"stack dumps show {len(stacks_waiting)} rank(s) waiting in a collective")
    if coll.height:
        timed_out = coll.select(pl.col("rank").filter(
            pl.col("_tracks") & pl.col("retired").fill_null(False) & ~pl.col("_finished")
        ).unique())["rank"]
        if timed_out.len():
            ranks = sorted(timed_out.to_list())
            why.append(f"the Flight Recorder marks collectives timed out on {len(ranks)} "
                       "rank(s)")
    dumped_at = frames.dumps["dumped_at"].drop_nulls() if frames.dumps.height \
        and "dumped_at" in frames.dumps.columns else pl.Series([], dtype=pl.Datetime("us", "UTC"))
    if dumped_at.len():
        ref = dumped_at.max()
        for g in report.groups:
            call = g.stuck_call
            if call is None or call.time_created is None or not g.waiting:
                continue
            age = (ref - call.time_created).total_seconds()  # type: ignore[operator]
            if age >= STALE_S:
                why.append(f"collective #{g.stuck_at} of {g.label} was pending for {age:.0f} s "
                           "when the dumps were taken")
                break


# --------------------------------------------------------------------------- helpers for rules

def crashed_ranks(job: Job) -> set[int]:
    """Ranks the logs show crashing (the job's ``crashes`` fact)."""
    return set(job.crashes.ranks)


def where_in_stacks(job: Job, ranks: Iterable[int]) -> dict[int, str]:
    """Rank → where its main thread is, from the stack dumps, as a phrase to follow "is":
    ``in validate (train.py:42) — evaluation``, ``waiting in barrier, called from main (…)``."""
    if job.stacks.height == 0:
        return {}
    by_rank = job.stack_tree.by_rank()
    out = {}
    for r in ranks:
        c = by_rank.get(r)
        if c is None:
            continue
        if c.collective is not None:
            out[r] = f"waiting in {c.collective.func}" + (
                f", called from {c.user_frame}" if c.user_frame else "")
        elif c.user_frame is not None:
            out[r] = f"in {c.user_frame}" + (f" — {c.place}" if c.place else "")
        elif c.innermost is not None:
            out[r] = f"in {c.innermost}"
    return out


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 1`` / ``ranks 0,2-5`` (long sets elided)."""
    return rank_phrase(ranks, empty="no rank")
