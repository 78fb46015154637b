"""Several stack snapshots of the same processes: which ranks moved between them.

Two ways to get several snapshots of one job:

* a bundle written by ``ddp-autopsy watch`` lists earlier py-spy samples in its manifest
  (``snapshots``, docs/watch.md); the bundle's own ``processes[].stack`` is the last one;
* several bundles of the same processes (``collect`` run two or three times on one host, then
  ``analyze b1 b2 b3``): the same ``(host, pid)`` appears once per bundle.

:func:`read_tree` reads the first kind, :func:`merge_repeated` folds the second into one set of
processes (the newest bundle's) so no rank is claimed by "3 processes"; both give a
:class:`Movement` per rank: did its main thread move between the first and last snapshot.

A rank *moved* when the signature of its main thread's stack (:func:`frame_signature`: function
and file of every frame, and the line of every caller) differs between snapshots.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job
    from ddp_autopsy.analyzer.sources import Tree


def main_thread(threads: list[dict[str, Any]], pid: int | None) -> dict[str, Any] | None:
    """The thread py-spy names after the process (``os_thread_id == pid``), else MainThread."""
    for th in threads:
        if isinstance(th, dict) and pid is not None and th.get("os_thread_id") == pid:
            return th
    for th in threads:
        if isinstance(th, dict) and th.get("thread_name") == "MainThread":
            return th
    return threads[0] if threads and isinstance(threads[0], dict) else None


def frame_signature(frames: list[dict[str, Any]]) -> str:
    """A digest of a thread's frames (innermost first): function and file of each frame and the
    line of every caller. The innermost line is left out: a loop around ``time.sleep`` or a
    C call is sampled on one of two lines of the same frame without having moved.

    >>> a = [{"name": "sleep_loop", "filename": "t.py", "line": 3},
    ...      {"name": "main", "filename": "t.py", "line": 9}]
    >>> b = [{**a[0], "line": 4}, a[1]]
    >>> frame_signature(a) == frame_signature(b)
    True
    >>> frame_signature(a) == frame_signature([a[0], {**a[1], "line": 10}])
    False
    """
    parts = [f"{f.get('name')}|{f.get('filename')}|{'' if i == 0 else f.get('line')}"
             for i, f in enumerate(frames)]
    return hashlib.sha1("\n".join(parts).encode(), usedforsecurity=False).hexdigest()[:16]


def frames_where(frames: list[dict[str, Any]], depth: int = 2) -> str:
    """``all_reduce (distributed_c10d.py:2501) < main (job.py:40)``: the innermost frames."""
    def short(f: dict[str, Any]) -> str:
        name = f.get("short_filename") or os.path.basename(str(f.get("filename", "?")))
        return f"{f.get('name')} ({name}:{f.get('line')})"

    return " < ".join(short(f) for f in frames[:depth]) or "(no Python frames)"


@dataclass(frozen=True)
class Point:
    """One process in one snapshot."""

    pid: int
    rank: int | None
    signature: str
    where: str


@dataclass
class Snapshot:
    taken: datetime | None
    points: dict[int, Point] = field(default_factory=dict)  # by pid


@dataclass(frozen=True)
class Movement:
    """What one rank did across the snapshots."""

    rank: int | None
    pid: int
    snapshots: int  # how many snapshots saw it
    moved: bool
    first: str  # where it was in the first snapshot
    last: str  # and in the last

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        if self.moved:
            return f"{who} moved: {self.first} -> {self.last}"
        return f"{who} did not move in {self.snapshots} snapshots: {self.last}"


def point(data: bytes | str, pid: int, rank: int | None) -> Point | None:
    """A py-spy ``dump --json`` document as a :class:`Point` (None when it does not parse)."""
    try:
        threads = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    th = main_thread(threads, pid) if isinstance(threads, list) else None
    if th is None:
        return None
    # Python frames only: native ones (py-spy --native names their library as ``module``)
    # differ between samples of a thread that waits in one place, and between dump modes
    frames = [f for f in th.get("frames") or [] if isinstance(f, dict) and not f.get("module")]
    return Point(pid, rank, frame_signature(frames), frames_where(frames))


def _when(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def read_tree(tree: Tree, manifest: dict[str, Any]) -> list[Snapshot]:
    """The snapshots of one bundle, oldest first: the manifest's ``snapshots`` entries, then the
    bundle's own stacks (``processes[].stack``, taken at ``created``). Empty when the bundle
    holds only its own stacks (nothing to compare)."""
    entries = manifest.get("snapshots")
    if not isinstance(entries, list) or not entries:
        return []
    ranks = {p["pid"]: p.get("rank") if p.get("rank") is not None else p.get("spawn_index")
             for p in manifest.get("processes") or []
             if isinstance(p, dict) and isinstance(p.get("pid"), int)}
    out: list[Snapshot] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("stacks"), dict):
            continue
        snap = Snapshot(_when(entry.get("taken")))
        for pid_s, rel in entry["stacks"].items():
            pid = int(pid_s) if str(pid_s).isdigit() else None
            data = tree.read_bytes(rel) if pid is not None and isinstance(rel, str) else None
            p = point(data, pid, ranks.get(pid)) if data is not None and pid is not None \
                else None
            if p is not None:
                snap.points[pid] = p
        out.append(snap)
    own = Snapshot(_when(manifest.get("created")))
    for proc in manifest.get("processes") or []:
        if not isinstance(proc, dict) or not proc.get("stack") or \
                not isinstance(proc.get("pid"), int):
            continue
        data = tree.read_bytes(proc["stack"])
        p = point(data, proc["pid"], ranks.get(proc["pid"])) if data is not None else None
        if p is not None:
            own.points[proc["pid"]] = p
    out.append(own)
    return out


def movement(snapshots: Iterable[Snapshot]) -> list[Movement]:
    """Per process seen in at least two snapshots: whether its signature changed."""
    seen: dict[int, list[Point]] = {}
    for snap in snapshots:
        for pid, p in snap.points.items():
            seen.setdefault(pid, []).append(p)
    out = []
    for pid, points in seen.items():
        if len(points) < 2:
            continue
        rank = next((p.rank for p in points if p.rank is not None), None)
        out.append(Movement(rank, pid, len(points),
                            len({p.signature for p in points}) > 1, points[0].where,
                            points[-1].where))
    return sorted(out, key=lambda m: (m.rank is None, m.rank, m.pid))


def moved(moves: Iterable[Movement], procs: Iterable[Any]) -> list[Any]:
    """The processes of ``procs`` (anything with ``rank`` and ``pid``) seen to move between
    snapshots: matched by rank when both know it, else by pid."""
    moves = list(moves)
    by_rank = {m.rank for m in moves if m.moved and m.rank is not None}
    by_pid = {m.pid for m in moves if m.moved}
    return [p for p in procs
            if (p.rank in by_rank if p.rank is not None and by_rank else p.pid in by_pid)]


def all_still(moves: Iterable[Movement], procs: Iterable[Any]) -> bool:
    """Whether every process of ``procs`` was seen in two snapshots or more and none moved
    (matched as :func:`moved` matches them)."""
    moves = list(moves)
    by_rank = {m.rank: m for m in moves if m.rank is not None}
    by_pid = {m.pid: m for m in moves}
    procs = list(procs)
    for p in procs:
        m = by_rank.get(p.rank) if p.rank is not None and by_rank else by_pid.get(p.pid)
        if m is None or m.moved or m.snapshots < 2:
            return False
    return bool(procs)


def still(moves: Iterable[Movement]) -> int:
    """How many snapshots saw the ranks that did not move (0: no comparison was possible)."""
    return max((m.snapshots for m in moves if not m.moved), default=0)


def one_per_process(moves: Iterable[Movement]) -> list[Movement]:
    """One movement per process, from several sources (copies of a bundle repeat its own
    snapshots): the one that saw it most often, moved if any of them saw it move."""
    by_pid: dict[int, Movement] = {}
    for m in sorted(moves, key=lambda m: m.snapshots):
        prev = by_pid.get(m.pid)
        by_pid[m.pid] = m if prev is None or not prev.moved or m.moved else prev
    return sorted(by_pid.values(), key=lambda m: (m.rank is None, m.rank, m.pid))


def summary(moves: list[Movement]) -> str:
    """One line: ``moved: rank 2; did not move: ranks 0, 1 (3 snapshots)``."""
    def ranks(ms: list[Movement]) -> str:
        names = [str(m.rank) if m.rank is not None else f"pid {m.pid}" for m in ms]
        return ("rank " if len(names) == 1 else "ranks ") + ", ".join(names)

    moved = [m for m in moves if m.moved]
    still = [m for m in moves if not m.moved]
    n = max((m.snapshots for m in moves), default=0)
    parts = ([f"moved: {ranks(moved)}"] if moved else []) + \
        ([f"did not move: {ranks(still)}"] if still else [])
    return "; ".join(parts) + f" ({n} snapshots)" if parts else "no snapshots to compare"


# -- several bundles of the same processes ----------------------------------------------------
def merge_repeated(job: Job) -> tuple[Job, list[Movement]]:
    """Fold bundles that saw the same ``(host, pid)`` into the newest one: its processes and
    stacks stay, the older bundles' rows for those processes go, and their stacks become the
    earlier snapshots of the returned movements. Bundles of different processes are untouched.
    The job is changed in place (frames replaced) and returned."""
    procs = job.processes
    if procs.height == 0 or "bundle" not in procs.columns:
        return job, []
    created = {b.display: _when(b.manifest.get("created")) for b in job.bundles}
    order = {name: (created.get(name) or datetime.min, name) for name in created}
    dup = procs.group_by("host", "pid").agg(pl.col("bundle").unique().alias("bundles")) \
        .filter(pl.col("bundles").list.len() > 1)
    if dup.height == 0:
        return job, []
    keep: dict[tuple[str | None, int], str] = {}
    for row in dup.iter_rows(named=True):
        keep[(row["host"], row["pid"])] = max(row["bundles"],
                                              key=lambda b: order.get(b, (datetime.min, b)))
    # snapshots from the stacks frame, one per bundle (oldest first), before dropping rows
    stacks = job.stacks
    snaps: dict[str, Snapshot] = {}
    bundles_by_len = sorted(created, key=len, reverse=True)  # longest prefix wins
    if stacks.height:
        main = stacks.filter(pl.col("depth").is_not_null()).sort("source", "thread_id", "depth")
        for (source, pid, host, tid), frame in main.group_by(
                "source", "pid", "host", "thread_id", maintain_order=True):
            main_thread_rows = tid == pid or frame["thread_name"][0] == "MainThread"
            if pid is None or (host, pid) not in keep or not main_thread_rows:
                continue
            bundle = next((b for b in bundles_by_len if str(source).startswith(b)), None)
            if bundle is None:
                continue
            frames = [{"name": r["func"], "filename": r["file"], "line": r["line"]}
                      for r in frame.iter_rows(named=True) if not r.get("native")]
            rank = frame["rank"][0]
            snap = snaps.setdefault(bundle, Snapshot(created.get(bundle)))
            snap.points[pid] = Point(pid, rank, frame_signature(frames), frames_where(frames))
    ordered = [snaps[b] for b in sorted(snaps, key=lambda b: order.get(b, (datetime.min, b)))]
    moves = movement(ordered)
    stale = [(h, p, b) for (h, p), newest in keep.items()
             for b in dup.filter((pl.col("host") == h) & (pl.col("pid") == p))["bundles"][0]
             if b != newest]
    if stale:
        drop = pl.DataFrame({"host": [s[0] for s in stale], "pid": [s[1] for s in stale],
                             "bundle": [s[2] for s in stale]},
                            schema={"host": pl.String, "pid": pl.Int64, "bundle": pl.String})
        job.processes = procs.join(drop, on=["host", "pid", "bundle"], how="anti",
                                   nulls_equal=True)
        if stacks.height:
            tagged = stacks.with_columns(pl.col("source").map_elements(
                lambda s: next((b for b in bundles_by_len if str(s).startswith(b)), None),
                return_dtype=pl.String).alias("bundle"))
            job.stacks = tagged.join(drop, on=["host", "pid", "bundle"], how="anti",
                                     nulls_equal=True).drop("bundle")
        job.forget()
    return job, moves
