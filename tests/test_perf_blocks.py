"""Reading a large file in blocks (events.iter_blocks): the first of BLOCK_BYTES, the next ones of
NEXT_BYTES, each ending at a line end, none made of one carried line; the events do not depend
on where the blocks end."""

from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ddp_autopsy.analyzer import events, job
from ddp_autopsy.analyzer.sources import InputNote

CASES = Path(__file__).parent / "rules" / "cases"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~1.5 MB of real rule-case logs one after another (tracebacks, failure summaries,
    prefixed lines, NCCL INFO): block ends fall inside multi-line messages."""
    out = tmp_path_factory.mktemp("blocks") / "all.log"
    parts: list[bytes] = []
    size = 0
    while size < 3 << 19:
        for log in sorted(CASES.glob("*/*.log")):
            data = log.read_bytes()
            if b"\r" in data or b"\x00" in data:
                continue
            parts.append(data if data.endswith(b"\n") else data + b"\n")
            size += len(parts[-1])
    out.write_bytes(b"".join(parts))
    return out


def _blocks(path: Path, monkeypatch: pytest.MonkeyPatch, first: int, after: int) -> list[bytes]:
    monkeypatch.setattr(events, "BLOCK_BYTES", first)
    monkeypatch.setattr(events, "NEXT_BYTES", after)
    notes: list[InputNote] = []
    with open(path, "rb") as fh:
        return list(events.iter_blocks(fh, str(path), notes))


@pytest.mark.parametrize(("first", "after"), [(1 << 18, 1 << 16), (1 << 16, 1 << 18),
                                              (1 << 17, 1 << 17)])
def test_blocks_end_at_lines_and_none_is_one_carried_line(
        big: Path, monkeypatch: pytest.MonkeyPatch, first: int, after: int) -> None:
    blocks = _blocks(big, monkeypatch, first, after)
    assert b"".join(blocks) == big.read_bytes()
    assert all(b.endswith(b"\n") for b in blocks)
    assert len(blocks[0]) <= first
    # each read's lines go into one block with the line carried from the read before it: no
    # block of one line between them (every other block was one, before)
    assert all(len(b) > min(first, after) // 2 for b in blocks[:-1])
    step = min(first, after)  # (a read is never longer than the first)
    assert len(blocks) <= 1 + -(-(big.stat().st_size - len(blocks[0])) // step) + 1


@pytest.mark.parametrize("gz", [False, True])
def test_events_do_not_depend_on_where_blocks_end(big: Path, tmp_path: Path, gz: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = big
    if gz:
        path = tmp_path / "all.log.gz"
        path.write_bytes(gzip.compress(big.read_bytes()))
    got = []
    for first, after in ((1 << 30, 1 << 30), (1 << 18, 1 << 16), (1 << 16, 1 << 18)):
        with monkeypatch.context() as m:
            m.setattr(events, "BLOCK_BYTES", first)
            m.setattr(events, "NEXT_BYTES", after)
            got.append(job.load([path]))
    one = got[0]
    assert one.events.height > 100
    for other in got[1:]:
        # (a block's last lines are each writer's there: which of them stay a file's last
        # lines may depend on where its blocks end in a file that mixes writers' conventions,
        # as this one does; every other event may not)
        assert_frame_equal(*(j.events.filter(pl.col("kind") != "last_line") for j in (one, other)))
        assert [n.to_dict() for n in one.notes] == [n.to_dict() for n in other.notes]
        assert [{**r.to_dict(), "events": 0} for r in one.inputs] \
            == [{**r.to_dict(), "events": 0} for r in other.inputs]  # (the count: last lines)
