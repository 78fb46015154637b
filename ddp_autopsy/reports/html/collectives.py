"""Process groups' collective timelines (Flight Recorder)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ddp_autopsy.reports.html.common import clean
from ddp_autopsy.rules.engine import Analysis


@dataclass
class CollGroupView:
    """One process group's collective timeline (Flight Recorder), ranks grouped by state."""

    anchor: str
    title: str
    facts: list[tuple[str, str]]
    rows: list[dict[str, str]]
    more: int


def collectives_views(analysis: Analysis) -> list[CollGroupView]:
    """Only when Flight Recorder dumps were read (see analyzer/collectives.py)."""
    coll = getattr(analysis.job, "collectives", None)
    if not isinstance(coll, pl.DataFrame) or coll.height == 0:
        return []
    from ddp_autopsy.analyzer import collectives

    views = []
    for i, g in enumerate(collectives.analyze(analysis.job).groups[:16]):
        facts = [("members", f"{len(g.members):,} ({g.members_from})")]
        if g.stuck_at is not None:
            call = g.stuck_call
            facts.append(("stuck at", f"#{g.stuck_at}" + (f" {call.shape}" if call else "")))
            if call and call.site:
                facts.append(("called from", call.site))
        if g.waiting:
            facts.append(("waiting", collectives.rank_list(g.waiting)))
        if g.not_joined:
            facts.append(("never joined", collectives.rank_list(g.not_joined)))
        if g.no_dump:
            facts.append(("no usable dump", collectives.rank_list(g.no_dump)))
        if g.divergence:
            d = g.divergence
            facts.append(("first divergence", f"#{d.seq} ({d.aspect}): "
                          f"{collectives.rank_list(d.culprits)}"))
        if g.laggards:
            facts.append(("laggards", collectives.rank_list(g.laggards)))
        rows, more = g.state_rows()
        views.append(CollGroupView(anchor=f"pg{i}", title=clean(g.label, 200),
                                   facts=[(k, clean(v, 300)) for k, v in facts],
                                   rows=[{k: clean(v, 300) for k, v in r.items()} for r in rows],
                                   more=more))
    return views
