"""The per-rank table as the reports show it: ranks that share a row collapsed into ranges.

>>> import polars as pl
>>> from ddp_autopsy.analyzer.rankstate import RANK_STATE_SCHEMA
>>> rows = [{"rank": r, "state": "failed", "collective": "all_reduce", "seq": 12}
...         for r in (0, 1, 3)] + [{"rank": 2, "state": "busy", "frame": "evaluate (t.py:3)"}]
>>> table = pl.DataFrame(rows, schema=RANK_STATE_SCHEMA)
>>> [(g.ranks, g.state, g.doing) for g in groups(table, culprits={2})]
[('2', 'busy', 'evaluate (t.py:3)'), ('0-1,3', 'failed', 'all_reduce #12')]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from ddp_autopsy.analyzer.ranksets import short_ranks
from ddp_autopsy.analyzer.rankstate import STATE_NAMES


@dataclass
class RankGroup:
    ranks: str  # "0-1,3"
    count: int
    state: str
    culprit: bool
    doing: str  # the frame, or the collective and its sequence number
    host: str | None
    last_line: str | None


def groups(table: pl.DataFrame, culprits: Iterable[int] = (), limit: int = 40) -> list[RankGroup]:
    """Rows of ranks in the same state, doing the same thing (culprits first, then by state)."""
    culprit_set = set(culprits)
    keyed: dict[tuple, list[dict]] = {}
    for row in table.iter_rows(named=True):
        doing = row["frame"] or ""
        if row["collective"]:
            doing = f"{row['collective']}" + (f" #{row['seq']}" if row["seq"] is not None else "")
            if row["frame"] and row["state"] == "waiting":
                doing += f" ← {row['frame']}"
        single_host = row["host"] if row["rank"] in culprit_set else None
        key = (row["rank"] in culprit_set, row["state"], doing, single_host)
        keyed.setdefault(key, []).append(row)
    out = []
    for (culprit, state, doing, _), rows in keyed.items():
        hosts = {r["host"] for r in rows if r["host"]}
        last = rows[-1]["last_line"] if len(rows) == 1 else None
        out.append(RankGroup(short_ranks(r["rank"] for r in rows), len(rows), state, culprit,
                             doing, next(iter(hosts)) if len(hosts) == 1 else None, last))
    order = {s: i for i, s in enumerate(STATE_NAMES)}
    out.sort(key=lambda g: (not g.culprit, order.get(g.state, 99), -g.count))
    return out[:limit]
