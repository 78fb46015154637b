"""The timeline: events per rank (or rank group) lane, as SVG marks.

Besides the timestamped log events: each rank's Flight Recorder position (its last completed
collective, and the one it still waits in, drawn as a bar to the end), the last line of each
rank whose line has no timestamp (as text in its lane), the first failure, the findings and the
collection moments. Plot elements carry ``data-x`` (and ``data-w``, ``data-c``) in plot
coordinates and the SVG its axis (``data-axis``) so that report.js can zoom and pan.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from ddp_autopsy.reports.html.common import TIMELINE_MAX_LANES, TIMELINE_MAX_MARKS, clean
from ddp_autopsy.rules.engine import Analysis

KIND_CATEGORY: dict[str, str] = {
    "run_start": "start",
    "last_line": "last",
    **{k: "failure" for k in ("exception", "worker_failed", "spawn_failed", "elastic_failure",
                              "oom", "nccl_error", "monitored_barrier_failed",
                              "collective_fingerprint_mismatch", "desync_never_joined",
                              "desync_not_joined")},
    **{k: "timeout" for k in ("watchdog_timeout", "watchdog_summary", "gloo_timeout",
                              "store_wait_timeout", "store_clients_timeout", "connect_timeout")},
    **{k: "network" for k in ("connect_failed", "connect_retry", "peer_closed",
                              "rdzv_connection_error", "port_in_use", "unresolved_host")},
    **{k: "signal" for k in ("agent_signal", "closing_signal")},
}
KIND_CATEGORY.update({"fr_completed": "collective", "fr_pending": "pending"})
CATEGORIES = ("start", "failure", "timeout", "network", "signal", "collective", "pending", "last",
              "other")
CATEGORY_LABEL = {"last": "last line of a rank", "collective": "last completed collective",
                  "pending": "collective not completed"}
TL_LEFT, TL_RIGHT, TL_WIDTH, TL_LANE, TL_TOP = 150, 24, 1000, 18, 22


@dataclass
class Mark:
    x: float
    y: float
    cat: str
    title: str


@dataclass
class Tick:
    x: float
    label: str
    anchor: str = "middle"


@dataclass
class Bar:
    """A collective a rank started and never completed: from its start to the plot's end."""

    x: float
    y: float
    w: float
    title: str


@dataclass
class TimelineView:
    width: int
    height: int
    left: int
    right: int
    lanes: list[tuple[float, str]]
    ticks: list[Tick]
    marks: list[Mark]
    findings: list[Flag]
    categories: list[tuple[str, int]]
    caption: str
    breaks: list[tuple[float, float, str]] = field(default_factory=list)  # cut gaps: x0, x1
    culprit_lanes: list[float] = field(default_factory=list)  # y of lanes with a culprit
    silent: list[tuple[float, str]] = field(default_factory=list)  # lanes without an event
    bars: list[Bar] = field(default_factory=list)
    #: Lanes whose rank's last line has no timestamp: (x, y, text), after the lane's marks.
    untimed: list[tuple[float, float, str]] = field(default_factory=list)
    #: The axis for report.js (zoom): [[x0, x1, ms0, ms1, cut], ...], ms from the first moment.
    axis: str = "[]"


def _lane_expr(ranks: set[int], hosts: set[str]) -> tuple[pl.Expr, str]:
    """Lanes: per rank (<= 32 ranks), else per host, else per block of ranks."""
    other = pl.lit("launcher / other")
    if 0 < len(ranks) <= TIMELINE_MAX_LANES:
        expr = (pl.when(pl.col("rank").is_not_null())
                .then(pl.format("rank {}", pl.col("rank")))
                .when(pl.col("host").is_not_null()).then(pl.format("host {}", pl.col("host")))
                .otherwise(other))
        return expr, "per rank"
    if 0 < len(hosts) <= TIMELINE_MAX_LANES:
        return pl.when(pl.col("host").is_not_null()).then(pl.col("host")).otherwise(other), \
            "per host"
    if ranks:
        block = max(1, math.ceil((max(ranks) + 1) / TIMELINE_MAX_LANES))
        lo = (pl.col("rank") // block) * block
        expr = (pl.when(pl.col("rank").is_not_null())
                .then(pl.format("ranks {}-{}", lo, lo + block - 1)).otherwise(other))
        return expr, f"per block of {block} ranks"
    return other, "in one lane"


def _lane_key(label: str) -> tuple[int, int, str]:
    m = re.match(r"ranks? (\d+)", label)
    if m:
        return (0, int(m.group(1)), label)
    return (2, 0, label) if label == "launcher / other" else (1, 0, label)


def _fmt_ts(ts: datetime, span: timedelta) -> str:
    if span < timedelta(seconds=10):
        return ts.strftime("%H:%M:%S.%f")[:-3]
    if span < timedelta(days=1):
        return ts.strftime("%H:%M:%S")
    return ts.strftime("%m-%d %H:%M")


#: Gaps with no event longer than this share of the span are drawn cut (≈), GAP_PX wide.
GAP_SHARE, GAP_PX, MAX_GAPS = 0.12, 26, 6
MIN_STRETCH_PX = 60  # a stretch between cut gaps is at least this wide
MARK_TEXT = 120  # characters of a mark's line in its tooltip
LABEL_CHAR_PX = 6.2  # width of a label character at the SVG's 11 px


@dataclass
class Flag:
    """A vertical marker over every lane: a finding, the first failure, the collection."""

    x: float
    y: float  # of its label (labels that would overlap go on the next row)
    label: str
    title: str
    cls: str  # "fl" (finding) | "first" | "collected"
    href: str | None
    anchor: str  # text-anchor of the label


class Axis:
    """Time → x, linear except for long empty gaps, which are cut to GAP_PX each."""

    def __init__(self, times: list[datetime], t0: datetime, t1: datetime, left: float,
                 right: float) -> None:
        span = max((t1 - t0).total_seconds(), 1e-3)
        pts = sorted(set(times) | {t0, t1})
        gaps = sorted(((b - a).total_seconds(), a, b) for a, b in itertools.pairwise(pts)
                      if (b - a).total_seconds() > GAP_SHARE * span)[-MAX_GAPS:]
        gaps.sort(key=lambda g: g[1])
        stretches, t = [], t0  # the drawn stretches between the cut gaps
        for _, a, b in gaps:
            stretches.append((t, a))
            t = b
        stretches.append((t, t1))
        secs = [(b - a).total_seconds() for a, b in stretches]
        free = right - left - GAP_PX * len(gaps)
        floor = min(MIN_STRETCH_PX, free / len(stretches)) if gaps else 0.0
        extra = free - floor * len(stretches)
        widths = [floor + (extra * d / sum(secs) if sum(secs) > 0 else extra / len(secs))
                  for d in secs]
        self.segments: list[tuple[datetime, datetime, float, float, bool]] = []
        x = left
        for k, ((a, b), w) in enumerate(zip(stretches, widths, strict=True)):
            self.segments.append((a, b, x, x + w, False))
            x += w
            if k < len(gaps):
                self.segments.append((b, gaps[k][2], x, x + GAP_PX, True))
                x += GAP_PX

    def x(self, t: datetime) -> float:
        for a, b, xa, xb, _ in self.segments:
            if t <= b:
                d = (b - a).total_seconds()
                f = (t - a).total_seconds() / d if d > 0 else 0.5
                return round(xa + max(0.0, min(1.0, f)) * (xb - xa), 1)
        return round(self.segments[-1][3], 1)

    def expr(self, col: str) -> pl.Expr:
        """The same mapping as a polars expression (for every event at once)."""
        out: pl.Expr | None = None
        for a, b, xa, xb, _ in reversed(self.segments):
            d = (b - a).total_seconds()
            seg = (pl.lit(xa) + ((pl.col(col) - a).dt.total_microseconds() / 1e6 / d)
                   .clip(0, 1) * (xb - xa)) if d > 0 else pl.lit((xa + xb) / 2)
            out = seg if out is None else pl.when(pl.col(col) <= b).then(seg).otherwise(out)
        assert out is not None
        return out

    def to_json(self, t0: datetime) -> str:
        """The segments for report.js: [[x0, x1, ms0, ms1, cut], ...], ms from ``t0``."""
        def ms(t: datetime) -> float:
            return round((t - t0).total_seconds() * 1000, 3)

        return json.dumps([[round(xa, 2), round(xb, 2), ms(a), ms(b), int(cut)]
                           for a, b, xa, xb, cut in self.segments])

    @property
    def breaks(self) -> list[tuple[float, float, str]]:
        return [(xa, xb, f"≈ {_span_text(b - a)}") for a, b, xa, xb, cut in self.segments if cut]


def _stack_labels(flags: list[Flag], right: float) -> int:
    """Give each flag's label a row where it overlaps no other label; return the rows used."""
    ends: list[float] = []
    for f in sorted(flags, key=lambda f: f.x):
        width = len(f.label) * LABEL_CHAR_PX + 6
        f.anchor = "end" if f.x + width > right else "start"
        lo = f.x - width if f.anchor == "end" else f.x
        row = next((i for i, e in enumerate(ends) if e < lo), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = lo + width
        f.y = 11 + row * 11
    return len(ends)


def collected_at(job: Any) -> list[tuple[datetime, str]]:
    """When each bundle was collected (its manifest's ``created``), as naive local time like
    the logs' stamps."""
    out = []
    for b in job.bundles:
        man = b.manifest if isinstance(b.manifest, dict) else {}
        try:
            when = datetime.fromisoformat(str(man.get("created")))
        except ValueError:
            continue
        when = when.astimezone().replace(tzinfo=None) if when.tzinfo else when
        out.append((when, clean(man.get("host") or b.display, 60)))
    return out


def _local(ts: datetime | None) -> datetime | None:
    """Flight Recorder times are UTC; log stamps are naive local time: compare as the latter."""
    if ts is None:
        return None
    return ts.astimezone().replace(tzinfo=None) if ts.tzinfo else ts


PTS_SCHEMA = {"ts": pl.Datetime("us"), "rank": pl.Int64, "host": pl.String, "kind": pl.String,
              "text": pl.String}
MAX_FR_GROUPS = 4  # process groups whose Flight Recorder position is drawn


def flight_recorder_marks(analysis: Analysis) -> pl.DataFrame:
    """Per rank and process group (the first few): the last completed collective and the one
    it started and never completed, as timeline points (``PTS_SCHEMA``)."""
    job = analysis.job
    coll = getattr(job, "collectives", None)
    if not isinstance(coll, pl.DataFrame) or coll.height == 0:
        return pl.DataFrame(schema=PTS_SCHEMA)
    from ddp_autopsy.analyzer import collectives

    times: dict[tuple[int, int | None, int], datetime] = {}
    for rank, pg, seq, created, started, completed in coll.select(
            "rank", "pg_id", "collective_seq_id", "time_created", "time_started",
            "time_completed").iter_rows():
        when = completed or started or created
        if rank is not None and seq is not None and when is not None:
            times[(rank, pg, seq)] = when
    rows = []
    for g in collectives.analyze(job).groups[:MAX_FR_GROUPS]:
        name = clean(g.label, 60)
        for r, st in sorted(g.ranks.items()):
            done = st.last_completed
            if done is not None and (r, g.pg_id, done) in times:
                call = g.calls_at(done).get(r)
                what = call.describe() if call else f"#{done}"
                rows.append({"ts": _local(times[(r, g.pg_id, done)]), "rank": r, "host": st.host,
                             "kind": "fr_completed",
                             "text": f"{name}: last completed {what}"})
            if st.pending is not None and st.pending.time_created is not None:
                rows.append({"ts": _local(st.pending.time_created), "rank": r, "host": st.host,
                             "kind": "fr_pending",
                             "text": f"{name}: started, never completed: "
                                     f"{st.pending.describe()}"})
    return pl.DataFrame(rows, schema=PTS_SCHEMA)


def timeline_view(analysis: Analysis) -> TimelineView | None:
    job = analysis.job
    events = job.events
    ev = events.filter(pl.col("ts").is_not_null()) if events.height else events
    fr = flight_recorder_marks(analysis)
    pts = pl.concat([ev.select([pl.col(c).cast(t) for c, t in PTS_SCHEMA.items()]), fr]) \
        if ev.height else fr
    collected = collected_at(job)
    if pts.height == 0 or pts["ts"].n_unique() + len({t for t, _ in collected}) < 2:
        return None  # one moment is no timeline (the report says so in one line)
    times = [t for t, _ in collected]
    t0 = min([pts["ts"].min(), *times])  # type: ignore[type-var]
    t1 = max([pts["ts"].max(), *times])  # type: ignore[type-var]
    assert isinstance(t0, datetime) and isinstance(t1, datetime)
    span = max(t1 - t0, timedelta(milliseconds=1))
    plot_right = TL_WIDTH - TL_RIGHT
    # The moments that matter for gaps: the first and last event of each fine time bin.
    bins = pts.group_by(pl.col("ts").dt.truncate(_grain(span)).alias("_g")).agg(
        pl.col("ts").min().alias("lo"), pl.col("ts").max().alias("hi"))
    stamps = [*bins["lo"].to_list(), *bins["hi"].to_list()]
    axis = Axis([*stamps, *times], t0, t1, TL_LEFT, plot_right)
    # Ranks whose last line has no time: shown as text in their lane (per-rank lanes only).
    state = job.rank_state
    untimed_last = {r: line for r, line, when in state.select(
        "rank", "last_line", "last_time").iter_rows() if line and when is None} \
        if state.height else {}
    ranks = set(pts["rank"].drop_nulls().to_list()) | set(untimed_last)
    lane, how = _lane_expr(ranks, set(pts["host"].drop_nulls().to_list()))
    pts = pts.with_columns(
        lane.alias("_lane"),
        pl.col("kind").replace_strict(KIND_CATEGORY, default="other").alias("_cat"),
        axis.expr("ts").alias("_x"),
    )
    px = 0.5  # fine bins, so that zooming in separates close events; coarser when too many
    while True:
        grouped = (
            pts.sort("ts")
            .with_columns((pl.col("_x") / px).floor().alias("_b"))
            .group_by("_lane", "_b", "_cat")
            .agg(pl.len().alias("n"), pl.col("kind").first(), pl.col("ts").first(),
                 pl.col("text").first(), pl.col("_x").first())
        )
        if grouped.height <= TIMELINE_MAX_MARKS or px >= 80:
            break
        px *= 2
    verdict = analysis.verdict
    culprits = set(verdict.ranks) if verdict else set()
    lanes = set(grouped["_lane"].unique().to_list())
    if how == "per rank":  # a silent culprit still gets its (empty) lane; so do untimed lines
        lanes |= {f"rank {r}" for r in culprits | set(untimed_last)}
    lanes_sorted = sorted(lanes, key=_lane_key)
    flags: list[Flag] = []
    for f in analysis.findings[:12]:
        if f.ts is not None and t0 <= f.ts <= t1:
            flags.append(Flag(axis.x(f.ts), 0, f.id, f"{f.id} {f.rule}: {clean(f.summary, 160)}",
                              "fl", f"#{f.id}", "start"))
    failing = pts.filter(pl.col("_cat").is_in(["failure", "timeout"])).sort("ts").head(1)
    if failing.height:
        ts, kind, text, name = failing.select("ts", "kind", "text", "_lane").row(0)
        flags.append(Flag(axis.x(ts), 0, "first failure",
                          f"first failure · {clean(name, 60)} · {ts.isoformat(sep=' ')} · "
                          f"{kind}: {clean(text, 200)}", "first", None, "start"))
    for when, host in collected:
        flags.append(Flag(axis.x(when), 0, "collected", f"collected on {host} at "
                          f"{when.isoformat(sep=' ', timespec='seconds')}", "collected", None,
                          "start"))
    rows = _stack_labels(flags, plot_right)
    top = TL_TOP + 11 * max(0, rows - 1)
    lane_y = {name: top + i * TL_LANE + TL_LANE / 2 for i, name in enumerate(lanes_sorted)}
    marks = []
    for name, _b, cat, n, kind, ts, text, x in grouped.sort("_b").iter_rows():
        count = f" ×{n}" if n > 1 else ""
        marks.append(Mark(round(x, 1), lane_y[name], cat,
                          f"{clean(name, 80)} · {ts.isoformat(sep=' ')} · {kind}{count}: "
                          f"{clean(text, MARK_TEXT)}"))
    bars = []
    if how == "per rank":
        for name, ts, text, x in pts.filter(pl.col("kind") == "fr_pending").select(
                "_lane", "ts", "text", "_x").iter_rows():
            bars.append(Bar(round(x, 1), lane_y[name], round(plot_right - x, 1),
                            f"{clean(name, 80)} · since {ts.isoformat(sep=' ')} · "
                            f"{clean(text, MARK_TEXT)}"))
    ticks = _ticks(axis, t0, span, plot_right)
    cats = dict(grouped.group_by("_cat").agg(pl.col("n").sum()).iter_rows())
    n_ev, n_fr = ev.height, fr.height
    caption = (f"{n_ev:,} timestamped event{'s' if n_ev != 1 else ''}"
               + (f" and {n_fr:,} Flight Recorder position{'s' if n_fr != 1 else ''}"
                  if n_fr else "")
               + f" {how}, {t0.isoformat(sep=' ')} → {t1.isoformat(sep=' ')} "
                 f"({_span_text(span)}).")
    if axis.breaks:
        caption += " Long stretches with no event are cut (≈)."
    untimed = events.height - ev.height
    if untimed:
        caption += (f" {untimed:,} event{'s' if untimed != 1 else ''} without a timestamp "
                    "not shown" + (" (the last line of each rank is, in its lane)"
                                   if how == "per rank" and untimed_last else "") + ".")
    drawn = set(grouped["_lane"].to_list())
    silent = [n for n in lanes_sorted if n not in drawn and _lane_rank(n) not in untimed_last]
    return TimelineView(
        width=TL_WIDTH, height=top + len(lanes_sorted) * TL_LANE + 28, left=TL_LEFT,
        right=plot_right,
        lanes=[(lane_y[n], clean(n, 40)) for n in lanes_sorted], ticks=ticks, marks=marks,
        findings=flags,
        categories=[(c, int(cats.get(c, 0))) for c in CATEGORIES if cats.get(c)],
        caption=caption, breaks=axis.breaks,
        culprit_lanes=[lane_y[n] for n in lanes_sorted if _lane_ranks(n) & culprits],
        silent=[(lane_y[n], "no line from this rank") for n in silent],
        bars=bars,
        untimed=_untimed(untimed_last, lane_y, marks, plot_right) if how == "per rank" else [],
        axis=axis.to_json(t0),
    )


def _untimed(lines: dict[int, str], lane_y: dict[str, float], marks: list[Mark],
             right: float) -> list[tuple[float, float, str]]:
    """Each untimed last line in its rank's lane, after the lane's last mark (it is the last
    line of its log, so it came after them), cut to the room left."""
    last_x: dict[float, float] = {}
    for m in marks:
        last_x[m.y] = max(last_x.get(m.y, 0.0), m.x)
    out = []
    for r, line in sorted(lines.items()):
        y = lane_y.get(f"rank {r}")
        if y is None:
            continue
        x = last_x[y] + 10 if y in last_x else TL_LEFT + 6
        room = int((right - x) / LABEL_CHAR_PX) - 20
        if room >= 16:
            out.append((round(x, 1), y, f"last line, no time: {clean(line, room)}"))
    return out


def _lane_rank(label: str) -> int | None:
    m = re.match(r"rank (\d+)$", label)
    return int(m.group(1)) if m else None


def _lane_ranks(label: str) -> set[int]:
    m = re.match(r"ranks? (\d+)(?:-(\d+))?$", label)
    if not m:
        return set()
    lo = int(m.group(1))
    return set(range(lo, int(m.group(2) or lo) + 1))


def _grain(span: timedelta) -> str:
    """Events closer than this are one moment when looking for gaps."""
    return f"{max(1, int(span.total_seconds() * 1e6 / 2000))}us"


def _ticks(axis: Axis, t0: datetime, span: timedelta, right: float) -> list[Tick]:
    """The start, the ends of each drawn stretch and a few between; labels precise enough to
    differ from their neighbours, none overlapping (each laid out by its own anchor)."""
    cands: list[tuple[float, datetime, timedelta]] = []
    for a, b, xa, xb, cut in axis.segments:
        if cut:
            continue
        if a == b:  # one moment: its tick in the middle
            cands.append(((xa + xb) / 2, a, span))
            continue
        n = max(1, int((xb - xa) // 170))
        cands += [(xa + (xb - xa) * i / n, a + (b - a) * i / n, (b - a) / n)
                  for i in range(n + 1)]
    ticks: list[Tick] = []
    right_edge = -1e9
    for x, t, step in sorted(cands, key=lambda c: c[0]):
        if not ticks or span >= timedelta(minutes=1):
            label = _fmt_ts(t, span)
        else:
            label = f"+{_rel_text(t - t0, step)}"
        if ticks and label == ticks[-1].label:
            continue
        w = len(label) * LABEL_CHAR_PX
        anchor = "start" if not ticks and x - w / 2 < axis.segments[0][2] else \
            "end" if x + w / 2 > right + 20 else "middle"
        lo = x if anchor == "start" else x - w if anchor == "end" else x - w / 2
        if lo < right_edge + 8:
            continue
        ticks.append(Tick(round(x, 1), label, anchor))
        right_edge = lo + w
    return ticks


def _rel_text(d: timedelta, step: timedelta) -> str:
    """``d`` in the unit _span_text would use, with the decimals ``step`` needs to show."""
    s, st = d.total_seconds(), max(step.total_seconds(), 1e-6)
    if s < 1:
        unit, scale = "ms", 1000.0
    elif s < 120:
        unit, scale = "s", 1.0
    elif s < 7200:
        unit, scale = "min", 1 / 60
    else:
        unit, scale = "h", 1 / 3600
    decimals = max(0, min(6, -math.floor(math.log10(st * scale)))) if st * scale < 1 else 0
    if unit == "s" and decimals == 0 and st < 1:
        decimals = 1
    return f"{s * scale:.{decimals}f} {unit}"


def _span_text(span: timedelta) -> str:
    s = span.total_seconds()
    if s < 0.01:
        return f"{s * 1000:.2g} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
