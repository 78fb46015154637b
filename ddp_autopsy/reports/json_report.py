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
    return layout(doc)


#: Lines are kept to about this width where an object or array fits on one.
WIDTH = 100
#: An array longer than this is never on one line with others: one element a line (ranks,
#: inputs), each on one line; one of numbers or strings alone is one line.
LONG = 16
#: From this depth on, an object or array is one line whatever its width (deep stack trees).
DEEP = 6
_compact = json.JSONEncoder(default=str, separators=(", ", ": ")).encode


def layout(obj: Any, indent: int = 0) -> str:
    """``obj`` as JSON for people and machines alike: an object or array that fits in
    :data:`WIDTH` on one line, as in docs/json.md, the rest one member a line, indented by two;
    a long array (ranks, inputs) one element a line. Each piece is written by the json module's
    C encoder (``indent=`` takes its pure-Python one: ~2x the time on a 1 MB report)."""
    if not isinstance(obj, (dict, list)) or not obj:
        return _compact(obj)
    pad, end = " " * (indent + 2), "\n" + " " * indent
    if isinstance(obj, list) and len(obj) > LONG:
        if not any(isinstance(x, (dict, list)) for x in obj):
            return _compact(obj)
        return "[\n" + ",\n".join(pad + _compact(x) for x in obj) + end + "]"
    if indent >= 2 * DEEP:
        return _compact(obj)
    values = obj.values() if isinstance(obj, dict) else obj
    if indent and not any(isinstance(v, (dict, list)) and len(v) > LONG for v in values):
        line = _compact(obj)  # (not tried where a long array inside would fail it anyway)
        if len(line) + indent <= WIDTH:
            return line
    if isinstance(obj, list):
        return "[\n" + ",\n".join(pad + layout(x, indent + 2) for x in obj) + end + "]"
    return "{\n" + ",\n".join(f"{pad}{_key(k)}: {layout(v, indent + 2)}"
                               for k, v in obj.items()) + end + "}"


def _key(key: Any) -> str:
    """A member's name as json.dumps writes it (``True`` as ``"true"``, ``1`` as ``"1"``)."""
    return _compact(key) if isinstance(key, str) else _compact({key: 0})[1:-4]
