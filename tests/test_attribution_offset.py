"""Rule 5 of analyzer/attribution.py: a node's unnamed local rank from the offset its named
ones share (torchrun numbers a node's workers contiguously), on a real 4x2 fault-matrix cell's
consoles (busy loop on rank 7, logs read while the launchers still ran: no failure summary)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ddp_autopsy.analyzer.attribution import CONTIGUOUS_CUE
from ddp_autopsy.analyzer.job import load

CASE = Path(__file__).parent / "rules" / "cases" / "COLL012-gloo-busy-last-4x2-node-offset"


def _ranks(job_events: pl.DataFrame, source_part: str, local: int) -> set[int | None]:
    rows = job_events.filter(pl.col("source").str.contains(source_part)
                             & (pl.col("local_rank") == local))
    return set(rows["rank"].to_list())


def test_unnamed_local_rank_takes_the_nodes_offset() -> None:
    job = load(sorted(CASE.glob("node-*/console.log")))
    assert _ranks(job.events, "node-3", 0) == {6}  # named: [default0]:[rank6]:
    assert _ranks(job.events, "node-3", 1) == {7}  # never named: 6 - 0 + 1
    assert CONTIGUOUS_CUE in set(job.events["cue"].drop_nulls().to_list())


def test_two_agents_in_one_file_get_no_offset(tmp_path: Path) -> None:
    """Near-miss: nodes 2 and 3 printing into one file (a shared console): [default0] is rank 4
    and rank 6 there, so no offset holds: [default1] keeps the one rank its own lines name
    (rule 3), and no line is given rank 7."""
    merged = tmp_path / "console.log"
    merged.write_text((CASE / "node-2" / "console.log").read_text()
                      + (CASE / "node-3" / "console.log").read_text())
    job = load([merged])
    assert _ranks(job.events, "console", 1) == {5}
    assert CONTIGUOUS_CUE not in set(job.events["cue"].drop_nulls().to_list())
