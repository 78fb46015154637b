"""Search every line of the inputs, classified or not, with the rank that wrote it.

The events frame keeps only the lines the catalog classifies; the others stay in the files and
are searched on demand (``ddp-autopsy grep``), streamed block by block like the analyzer reads
them: any layout, archives and compressed files in place, bounded memory. Each hit carries the
rank and host its own prefix or its file's name says (unknown stays unknown).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
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
    Member,
    decompressed,
    iter_inputs,
)
from ddp_autopsy.analyzer.stacks import looks_like_pyspy_json
from ddp_autopsy.bundle_layout import manifest_processes

#: Only a line's rank and host are used: the year its stamps would get does not matter.
ANY_YEAR = 2000


@dataclass(frozen=True)
class Hit:
    path: str
    line: int
    rank: int | None
    host: str | None
    text: str
    #: The torchrun local rank (``[default2]:`` prefix, ``attempt_0/2/`` log dir), when known.
    local_rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GrepStats:
    """What a search read: ``readable`` paths (the CLI exits 3 when none was), and the lines
    left out of ``--rank N`` because only their local rank is known (``unmapped``)."""

    readable: int = 0
    unmapped: int = 0


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable regex (polars' syntax), or None: the regex engine's own
    explanation (the pattern with a caret under the fault, then ``error: ...``), without
    polars' context."""
    try:
        pl.Series([""]).str.contains(pattern)
    except pl.exceptions.PolarsError as err:
        lines: list[str] = []
        for ln in str(err).splitlines():
            if ln.strip().startswith(("This error occurred", "Resolved plan")):
                break
            lines.append(ln.rstrip())
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            return str(err).splitlines()[0] if str(err) else type(err).__name__
        lines[0] = lines[0].removeprefix("regex error: ")
        return "\n".join(lines)
    return None


@dataclass
class _BundleRanks:
    """What a collect bundle's manifest says about its logs' writers."""

    by_path: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    by_local: dict[int, int] = field(default_factory=dict)


def _bundle_ranks(manifest: dict[str, Any]) -> _BundleRanks:
    known = _BundleRanks()
    procs: dict[int, dict[str, Any]] = {}
    for proc in manifest_processes(manifest):
        procs[proc["pid"]] = proc
    locals_: dict[int, set[int]] = {}
    for proc in procs.values():
        if isinstance(proc.get("rank"), int) and isinstance(proc.get("local_rank"), int):
            locals_.setdefault(proc["local_rank"], set()).add(proc["rank"])
    known.by_local = {lr: next(iter(rs)) for lr, rs in locals_.items() if len(rs) == 1}
    for entry in manifest.get("logs") or []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            proc = procs.get(entry.get("pid")) if isinstance(entry.get("pid"), int) else None
            if proc is not None and isinstance(proc.get("rank"), int):
                known.by_path[entry["path"].lstrip("./")] = (proc["rank"], proc.get("local_rank"))
    return known


def _file_map(member: Member, notes: list[InputNote], path_local: int | None
              ) -> tuple[dict[int, int], int | None]:
    """From a file's lines that name both (``[default2]:[rank2]: ...``): local rank → rank,
    where one rank only; and for a torchrun log-dir file (``path_local``), the one rank its
    ranked lines name, if they name one."""
    with decompressed(member) as fh:
        found = search(fh, member.display, notes, r"\[(?i:rank)\s*\d+\]|\[RANK \d+\]")
    pairs: dict[int, set[int]] = {}
    ranks: set[int] = set()
    for _line, text in found.iter_rows():
        info = parse_line(text, ANY_YEAR)
        if info.rank is None:
            continue
        ranks.add(info.rank)
        if info.local_rank is not None:
            pairs.setdefault(info.local_rank, set()).add(info.rank)
    mapping = {lr: next(iter(rs)) for lr, rs in pairs.items() if len(rs) == 1}
    whole = next(iter(ranks)) if path_local is not None and len(ranks) == 1 else None
    return mapping, whole


def grep(paths: Iterable[Path | str], pattern: str, notes: list[InputNote], *,
         rank: int | None = None, local_rank: int | None = None,
         stats: GrepStats | None = None) -> Iterator[Hit]:
    """Lines matching ``pattern`` in every text input, in input order (``rank``: only the lines
    known to come from that global rank; ``local_rank``: from that torchrun local rank).

    A line's rank is its own prefix's (``[rank12]:``, srun ``12:`` confirmed by it), else its
    file's (name, or a bundle manifest's process), else its local rank's (``[default2]:``,
    ``attempt_0/2/``) mapped through the lines of the same file that name both, or through
    the bundle's processes. Unknown stays unknown."""
    from ddp_autopsy.analyzer.job import _split_bundles

    stats = stats if stats is not None else GrepStats()
    for _path, tree in iter_inputs([Path(p) for p in paths], notes):
        stats.readable += 1
        bundles, loose = _split_bundles(tree, notes)
        groups: list[tuple[list[Member], _BundleRanks]] = [
            (sub.members, _bundle_ranks(b.manifest)) for sub, b in bundles]
        groups.append((loose, _BundleRanks()))
        for members, known in groups:
            for member in members:
                yield from _grep_member(member, pattern, notes, known, rank, local_rank, stats)


def _grep_member(member: Member, pattern: str, notes: list[InputNote], known: _BundleRanks,
                 rank: int | None, local_rank: int | None, stats: GrepStats) -> Iterator[Hit]:
    if any(member.relpath.lower().endswith(s) for s in SKIP_SUFFIXES):
        return
    cue = attribution_from_path(member.relpath)
    file_rank, file_local = known.by_path.get(member.relpath.lstrip("./"), (None, None))
    file_rank = file_rank if file_rank is not None else cue.rank
    file_local = file_local if file_local is not None else cue.local_rank
    try:
        with decompressed(member) as fh:
            head = fh.read(65536)
        if looks_like_dump(head, member.relpath) or looks_like_pyspy_json(head):
            return  # Flight Recorder pickles and stack JSON are not lines
        with decompressed(member) as fh:
            found = search(fh, member.display, notes, pattern)
    except READ_ERRORS as err:
        notes.append(InputNote(member.display, f"cannot read: {err}", "warning"))
        return
    mapped: tuple[dict[int, int], int | None] | None = None
    for line, text in found.iter_rows():
        info = parse_line(text, ANY_YEAR)
        lr = info.local_rank if info.local_rank is not None else file_local
        who = info.rank if info.rank is not None else \
            file_rank if info.local_rank is None else None
        if who is None and lr is not None:
            if mapped is None:
                try:
                    mapped = _file_map(member, notes, cue.local_rank)
                except READ_ERRORS:
                    mapped = ({}, None)
            who = mapped[0].get(lr, known.by_local.get(lr))
            if who is None and info.local_rank is None:
                who = mapped[1]
        if rank is not None and who != rank:
            if who is None and lr == rank:
                stats.unmapped += 1
            continue
        if local_rank is not None and lr != local_rank:
            continue
        yield Hit(member.display, line, who, info.host or cue.host, text, lr)
