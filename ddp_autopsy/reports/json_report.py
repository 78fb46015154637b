"""The JSON report: the public contract ``ddp-autopsy/analysis/1`` (docs/json.md,
``ddp_autopsy/schemas/analysis.schema.json``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import polars as pl

from ddp_autopsy import __version__
from ddp_autopsy.analyzer.ranksets import format_ranks
from ddp_autopsy.rules.engine import Analysis

SCHEMA_ID = "ddp-autopsy/analysis/1"


def to_dict(analysis: Analysis) -> dict[str, Any]:
    job = analysis.job
    verdict = analysis.verdict
    ranks = [
        {
            "rank": row["rank"],
            "hosts": row["hosts"],
            "local_rank": row["local_rank"],
            "pids": row["pids"],
            "has_stack": row["has_stack"],
        }
        for row in job.ranks.iter_rows(named=True)
    ]
    culprits = set(verdict.ranks) if verdict else set()
    # Ranks no input names are listed as ranges, not rows (a 65536-rank world with 4 logs).
    state = job.rank_state
    missing = state.filter(pl.col("state") == "missing")["rank"].to_list()
    table = [{**row, "last_time": row["last_time"].isoformat() if row["last_time"] else None,
              "culprit": row["rank"] in culprits}
             for row in state.filter(pl.col("state") != "missing").iter_rows(named=True)]
    return {
        "schema": SCHEMA_ID,
        "tool": {"name": "ddp-autopsy", "version": __version__},
        "verdict": verdict.to_dict() if verdict else None,
        "findings": [f.to_dict() for f in analysis.findings],
        "inputs": [rec.to_dict() for rec in job.inputs],
        "notes": [n.to_dict() for n in job.notes],
        "ranks": {"world_size": job.world_size, "known": ranks, "table": table,
                  "missing": format_ranks(missing)},
        "stacks": job.stack_tree.to_dict() if job.stacks.height else None,
        "snapshots": [dataclasses.asdict(m) for m in job.snapshot_moves],
        "rules": [o.to_dict() for o in analysis.outcomes],
    }


def render(analysis: Analysis, *, redact: bool = False) -> str:
    """The JSON document; ``redact``: every string in it passed through ddp_autopsy.redact."""
    doc = to_dict(analysis)
    if redact:
        from ddp_autopsy.redact import redact_obj

        doc = redact_obj(doc)
    return json.dumps(doc, indent=2, default=str)
