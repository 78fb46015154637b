"""Compact summaries written into the bundle: the copied logs pre-parsed into the ``events``
frame (``summaries/events.parquet``), so that analyzing thousands of bundles reads small
summaries instead of re-reading every raw log. The raw logs stay in the bundle for evidence;
``ddp-autopsy analyze --raw-logs`` ignores the summaries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl

from ddp_autopsy import __version__
from ddp_autopsy.bundle_layout import SUMMARY_EVENTS as EVENTS


def write(root: Path) -> dict[str, Any]:
    """Parse the bundle's logs with the analyzer itself and store the result; return the
    manifest entry ``{"events": path, "rows": n, "logs": {log path: lines}, "tool_version",
    "catalog"}``: the reader ignores a summary made by another version or message catalog."""
    from ddp_autopsy.analyzer.job import load
    from ddp_autopsy.analyzer.patterns import catalog_hash

    job = load([root], use_summaries=False)
    prefix = f"{root}/"
    rel = pl.col("source").str.strip_prefix(prefix)
    events = job.events.with_columns(rel.alias("source"))
    dest = root / EVENTS
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
    try:
        events.write_parquet(tmp)  # into the 0600 file made above
        os.chmod(tmp, 0o600)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    logs = {rec.path.removeprefix(prefix): rec.lines for rec in job.inputs if rec.kind == "log"}
    return {"events": EVENTS, "rows": events.height, "logs": logs, "tool_version": __version__,
            "catalog": catalog_hash()}
