"""The timeline: events per rank (or rank group) lane, as SVG marks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from ddp_autopsy.reports.html.common import TIMELINE_MAX_LANES, TIMELINE_MAX_MARKS, clean
from ddp_autopsy.rules.engine import Analysis

KIND_CATEGORY: dict[str, str] = {
    "run_start": "start",
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
CATEGORIES = ("start", "failure", "timeout", "network", "signal", "other")
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


@dataclass
class FindingLine:
    x: float
    y: float  # of its label (labels of close findings are staggered)
    id: str
    title: str
    anchor: str  # text-anchor of the label


@dataclass
class TimelineView:
    width: int
    height: int
    left: int
    right: int
    lanes: list[tuple[float, str]]
    ticks: list[Tick]
    marks: list[Mark]
    findings: list[FindingLine]
    categories: list[tuple[str, int]]
    caption: str


def _lane_expr(ev: pl.DataFrame) -> tuple[pl.Expr, str]:
    ranks = ev["rank"].drop_nulls()
    hosts = ev["host"].drop_nulls()
    other = pl.lit("launcher / other")
    if 0 < ranks.n_unique() <= TIMELINE_MAX_LANES:
        expr = (pl.when(pl.col("rank").is_not_null())
                .then(pl.format("rank {}", pl.col("rank")))
                .when(pl.col("host").is_not_null()).then(pl.format("host {}", pl.col("host")))
                .otherwise(other))
        return expr, "per rank"
    if 0 < hosts.n_unique() <= TIMELINE_MAX_LANES:
        return pl.when(pl.col("host").is_not_null()).then(pl.col("host")).otherwise(other), \
            "per host"
    if ranks.len():
        block = max(1, math.ceil((int(ranks.max()) + 1) / TIMELINE_MAX_LANES))  # type: ignore[arg-type]
        lo = (pl.col("rank") // block) * block
        expr = (pl.when(pl.col("rank").is_not_null())
                .then(pl.format("ranks {}-{}", lo, lo + block - 1)).otherwise(other))
        return expr, f"per block of {block} ranks"
    return other, "all events"


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


def timeline_view(analysis: Analysis) -> TimelineView | None:
    events = analysis.job.events
    if events.height == 0:
        return None
    ev = events.filter(pl.col("ts").is_not_null())
    if ev.height == 0:
        return None
    t0, t1 = ev["ts"].min(), ev["ts"].max()
    assert isinstance(t0, datetime) and isinstance(t1, datetime)
    span = max(t1 - t0, timedelta(milliseconds=1))
    lane, how = _lane_expr(ev)
    ev = ev.with_columns(
        lane.alias("_lane"),
        pl.col("kind").replace_strict(KIND_CATEGORY, default="other").alias("_cat"),
        ((pl.col("ts") - t0).dt.total_microseconds() / (span.total_seconds() * 1e6))
        .alias("_pos"),
    )
    buckets = 200
    while True:
        grouped = (
            ev.sort("ts")
            .with_columns((pl.col("_pos") * buckets).floor().clip(0, buckets - 1).alias("_b"))
            .group_by("_lane", "_b", "_cat")
            .agg(pl.len().alias("n"), pl.col("kind").first(), pl.col("ts").first(),
                 pl.col("text").first())
        )
        if grouped.height <= TIMELINE_MAX_MARKS or buckets <= 10:
            break
        buckets //= 2
    lanes = sorted(grouped["_lane"].unique().to_list(), key=_lane_key)
    plot = TL_WIDTH - TL_LEFT - TL_RIGHT
    flines: list[FindingLine] = []
    timed = sorted((f for f in analysis.findings[:12] if f.ts is not None and t0 <= f.ts <= t1),
                   key=lambda f: f.ts or t0)
    row, last_x = 0, -1e9
    for f in timed:
        x = TL_LEFT + (f.ts - t0) / span * plot  # type: ignore[operator]
        row = row + 1 if x - last_x < 26 and row < 3 else 0
        last_x = x
        flines.append(FindingLine(round(x, 1), 11 + row * 11, f.id,
                                  f"{f.id} {f.rule}: {clean(f.summary, 160)}",
                                  "end" if x > TL_WIDTH - TL_RIGHT - 30 else "start"))
    top = TL_TOP + (11 * max((int((fl.y - 11) / 11) for fl in flines), default=0))
    lane_y = {name: top + i * TL_LANE + TL_LANE / 2 for i, name in enumerate(lanes)}
    marks = []
    for name, b, cat, n, kind, ts, text in grouped.sort("_b").iter_rows():
        x = TL_LEFT + (b + 0.5) / buckets * plot
        count = f" ×{n}" if n > 1 else ""
        marks.append(Mark(round(x, 1), lane_y[name], cat,
                          f"{clean(name, 80)} · {ts.isoformat(sep=' ')} · {kind}{count}: "
                          f"{clean(text, 200)}"))
    if span >= timedelta(minutes=1):
        labels = [_fmt_ts(t0 + span * i / 5, span) for i in range(6)]
    else:  # short spans: the start, then offsets from it
        labels = [_fmt_ts(t0, span)] + [f"+{_span_text(span * i / 5)}" for i in range(1, 6)]
    ticks = [Tick(round(TL_LEFT + i / 5 * plot, 1), label) for i, label in enumerate(labels)]
    cats = dict(grouped.group_by("_cat").agg(pl.col("n").sum()).iter_rows())
    untimed = events.height - ev.height
    caption = (f"{ev.height:,} timestamped events {how}, {t0.isoformat(sep=' ')} → "
               f"{t1.isoformat(sep=' ')} ({_span_text(span)}); time axis in {buckets} bins.")
    if untimed:
        caption += f" {untimed:,} events without a timestamp are not shown."
    return TimelineView(
        width=TL_WIDTH, height=top + len(lanes) * TL_LANE + 28, left=TL_LEFT,
        right=TL_WIDTH - TL_RIGHT, lanes=[(lane_y[n], clean(n, 40)) for n in lanes],
        ticks=ticks, marks=marks, findings=flines,
        categories=[(c, int(cats.get(c, 0))) for c in CATEGORIES if cats.get(c)],
        caption=caption,
    )


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
