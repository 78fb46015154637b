"""Search every line of the inputs, classified or not, with the rank that wrote it.

The events frame keeps only the lines the catalog classifies; the others stay in the files and
are searched on demand (``ddp-autopsy grep``), streamed block by block like the analyzer reads
them: any layout, archives and compressed files in place, bounded memory. Each hit carries the
rank and host its own prefix or its file's name says (unknown stays unknown).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ddp_autopsy.analyzer.events import search
from ddp_autopsy.analyzer.flight_recorder import looks_like_dump
from ddp_autopsy.analyzer.layout import attribution_from_path
from ddp_autopsy.analyzer.lines import parse_line
from ddp_autopsy.analyzer.sources import (
    READ_ERRORS,
    SKIP_SUFFIXES,
    InputNote,
    decompressed,
    iter_inputs,
)
from ddp_autopsy.analyzer.stacks import looks_like_pyspy_json

#: Only a line's rank and host are used: the year its stamps would get does not matter.
ANY_YEAR = 2000


@dataclass(frozen=True)
class Hit:
    path: str
    line: int
    rank: int | None
    host: str | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable regex (polars' syntax), or None."""
    try:
        pl.Series([""]).str.contains(pattern)
    except pl.exceptions.PolarsError as err:
        return str(err).splitlines()[0]
    return None


def grep(paths: Iterable[Path | str], pattern: str, notes: list[InputNote], *,
         rank: int | None = None) -> Iterator[Hit]:
    """Lines matching ``pattern`` in every text input, in input order (``rank``: only the lines
    known to come from that rank)."""
    for _path, tree in iter_inputs([Path(p) for p in paths], notes):
        for member in tree.members:
            if any(member.relpath.lower().endswith(s) for s in SKIP_SUFFIXES):
                continue
            cue = attribution_from_path(member.relpath)
            try:
                with decompressed(member) as fh:
                    head = fh.read(65536)
                if looks_like_dump(head, member.relpath) or looks_like_pyspy_json(head):
                    continue  # Flight Recorder pickles and stack JSON are not lines
                with decompressed(member) as fh:
                    found = search(fh, member.display, notes, pattern)
            except READ_ERRORS as err:
                notes.append(InputNote(member.display, f"cannot read: {err}", "warning"))
                continue
            for line, text in found.iter_rows():
                info = parse_line(text, ANY_YEAR)
                who = info.rank if info.rank is not None else cue.rank
                if rank is not None and who != rank:
                    continue
                yield Hit(member.display, line, who, info.host or cue.host, text)
