"""The per-rank table: ``job.rank_state`` grouped into rank ranges (reports/ranktable.py), the
verdict's culprits first and marked. Sorting and filtering are report.js's."""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from ddp_autopsy.analyzer.rankstate import RANK_STATE_SCHEMA
from ddp_autopsy.reports.html.common import clean
from ddp_autopsy.reports.html.grid import lost_peer_only
from ddp_autopsy.reports.ranktable import groups
from ddp_autopsy.rules.engine import Analysis

#: Rows shown; the rest are counted (4096 ranks in distinct states stay a bounded page).
MAX_RANK_ROWS = 400


@dataclass
class RankRow:
    ranks: str
    first: int  # the lowest rank, the sort key of the ranks column
    count: int
    state: str
    culprit: bool
    host: str
    pid: str
    doing: str
    last_line: str
    last_time: str


@dataclass
class RankTableView:
    rows: list[RankRow]
    more: int
    total: int
    #: Optional columns some row fills (a column empty in every row is left out).
    shown: frozenset[str] = frozenset({"host", "pid", "last_line", "last_time"})


def rank_table_view(analysis: Analysis) -> RankTableView | None:
    table = analysis.job.rank_state
    if table.height == 0:
        return None
    verdict = analysis.verdict
    culprits = set(verdict.ranks) if verdict else set()
    silent = sorted(culprits - set(table["rank"].to_list()))
    if silent:  # a culprit no line names (logs-only: the rank that never reached a collective)
        table = pl.concat([table, pl.DataFrame(
            [{"rank": r, "state": "missing", "why": "named by the verdict, silent in the inputs"}
             for r in silent], schema=RANK_STATE_SCHEMA)]).sort("rank")
    demoted = lost_peer_only(analysis)  # as the grid: a lost peer's error is not a crash
    if demoted:
        table = table.with_columns(pl.when(pl.col("rank").is_in(list(demoted)))
                                   .then(pl.lit("failed")).otherwise(pl.col("state"))
                                   .alias("state"))
    grouped = groups(table, culprits=culprits, limit=table.height)
    single = {r: (pid, t) for r, pid, t in
              table.select("rank", "pid", "last_time").iter_rows()}
    rows = []
    for g in grouped[:MAX_RANK_ROWS]:
        m = re.match(r"\d+", g.ranks)
        first = int(m.group()) if m else -1
        pid, when = single.get(first, (None, None)) if g.count == 1 else (None, None)
        rows.append(RankRow(
            ranks=g.ranks, first=first, count=g.count,
            state=g.state, culprit=g.culprit,
            host=clean(g.host, 60) if g.host else "", pid=str(pid) if pid else "",
            doing=clean(g.doing, 200), last_line=clean(g.last_line, 200) if g.last_line else "",
            last_time=when.isoformat(sep=" ", timespec="milliseconds") if when else "",
        ))
    shown = frozenset(c for c in ("host", "pid", "last_line", "last_time")
                      if any(getattr(r, c) for r in rows))
    return RankTableView(rows, max(0, len(grouped) - MAX_RANK_ROWS), table.height, shown)
