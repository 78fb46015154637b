"""Which ranks crashed: the one definition the collective report, the rules and the reports use.

A rank crashed when an active event tagged ``crash`` (an exception, a torchelastic failure entry,
a failed spawn, an OOM) is attributed to it, by its prefix or by the rank field of a torchelastic
summary entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from ddp_autopsy.analyzer.patterns import kinds_tagged

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job

CRASH_KINDS: tuple[str, ...] = kinds_tagged("crash")


@dataclass(frozen=True)
class Crashes:
    #: Ranks the logs show crashing.
    ranks: frozenset[int] = frozenset()
    #: The crash events themselves (active rows only), in input order.
    events: pl.DataFrame = field(default_factory=pl.DataFrame)

    def __contains__(self, rank: object) -> bool:
        return rank in self.ranks


def build(job: Job) -> Crashes:
    events = job.active_events
    if events.height == 0:
        return Crashes()
    rows = events.filter(pl.col("kind").is_in(CRASH_KINDS))
    ranks = set(rows["rank"].drop_nulls().to_list())
    for data in rows.filter(pl.col("kind") == "elastic_failure")["data"].to_list():
        rank = json.loads(data or "{}").get("rank")
        if isinstance(rank, int):
            ranks.add(rank)
    return Crashes(frozenset(ranks), rows)
