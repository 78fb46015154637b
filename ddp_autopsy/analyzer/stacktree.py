"""All ranks' stacks merged into one prefix tree: where every rank is, at a glance.

The ``stacks`` frame holds one row per frame of every dumped thread. :func:`build` takes each
process's main thread, reads its frames from the outermost (``<module>``) inward and merges them
into a prefix tree whose nodes carry the processes that passed through them, labelled as rank
ranges (``ranks 0-6,8``, ``rank 7``; ``pid 4242`` for a process with no known rank).

Processes with identical main-thread stacks form an equivalence class (:class:`StackClass`,
largest first). Classes much smaller than the largest one are the *outliers*: the rank that is in
``evaluate`` while 4095 others wait in ``all_reduce``.

Native frames (``py-spy dump --native``, normalised by :mod:`~ddp_autopsy.analyzer.stacks`) do
not decide the classes: processes are grouped by their Python frames, so a native frame that
differs between two ranks (a futex caught in another libc call) never makes an outlier, and the
verdict names the innermost Python frame of the user's code. Each class's path in the tree is its
Python frames with the native frames of its most common full stack, so the C/C++ frames below
the innermost Python frame are shown beneath it.

Launcher agents and DataLoader workers (``processes`` role ``agent`` / ``dataloader`` / ``other``)
are kept out of the main tree and merged into trees of their own (:attr:`StackTree.side`); threads
other than the main one are merged into :attr:`StackTree.threads` when they matter (running or
holding the GIL).

>>> import polars as pl
>>> from ddp_autopsy.analyzer.stacks import STACK_SCHEMA
>>> def dump(rank, *frames):  # innermost first, like py-spy
...     return [dict(source=f"rank{rank}.txt", host="n1", pid=100 + rank, rank=rank,
...                  local_rank=rank, thread_id=100 + rank, thread_name="MainThread", idle=True,
...                  owns_gil=False, depth=d, func=f, file=fl, line=ln)
...             for d, (f, fl, ln) in enumerate(frames)]
>>> wait = [("all_reduce", "torch/distributed/distributed_c10d.py", 3252),
...         ("main", "train.py", 48), ("<module>", "train.py", 60)]
>>> rows = dump(0, *wait) + dump(1, *wait) + dump(3, *wait) + dump(
...     2, ("evaluate", "train.py", 30), ("main", "train.py", 52), ("<module>", "train.py", 60))
>>> tree = build(pl.DataFrame(rows, schema=STACK_SCHEMA))
>>> [(c.label, c.innermost.func) for c in tree.classes]
[('ranks 0-1,3', 'all_reduce'), ('rank 2', 'evaluate')]
>>> [c.label for c in tree.outliers]
['rank 2']
>>> print(tree.outliers[0].diverges_at)
<module> (train.py:60)
>>> top = tree.root.children[0]  # the tree is path-compressed: nodes hold runs of frames
>>> [f.func for f in top.frames], top.label, [c.label for c in top.children]
(['<module>'], 'ranks 0-3', ['ranks 0-1,3', 'rank 2'])
>>> [str(f) for f in top.children[0].frames]
['main (train.py:48)', 'all_reduce (torch/distributed/distributed_c10d.py:3252)']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from ddp_autopsy.analyzer.ranksets import short_ranks
from ddp_autopsy.analyzer.stackview import COLLECTIVES, LIBRARY_FILE, Frame, RankStack

#: Process roles (``processes`` frame) kept out of the main tree, in trees of their own.
SIDE_ROLES: tuple[str, ...] = ("agent", "dataloader", "other")
#: A class is an outlier when it has at most this fraction of the largest class's members.
OUTLIER_RATIO = 0.5
Granularity = Literal["line", "function"]


@dataclass(frozen=True)
class Proc:
    """One dumped thread's owner: a process (or, in :attr:`StackTree.threads`, one thread)."""

    source: str
    host: str | None
    pid: int | None
    rank: int | None
    local_rank: int | None
    thread_id: int | None
    thread_name: str | None
    idle: bool
    owns_gil: bool
    role: str | None = None
    #: The innermost torch.distributed call's arguments that name ranks (``"src=1
    #: group_src=1"``, stacks.STACK_SCHEMA's ``args``): None when the dump kept no locals.
    args: str | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    @property
    def call_args(self) -> dict[str, str]:
        """:attr:`args` as a mapping: ``{"src": "1", "group_src": "1"}``."""
        return dict(a.split("=", 1) for a in (self.args or "").split() if "=" in a)


def who(procs: Iterable[Proc], limit: int = 8) -> str:
    """``ranks 0-6,8`` / ``rank 7`` / ``pid 4242`` / ``ranks 0-3, pids 11,12``.

    At most ``limit`` ranges are spelled out; longer sets are elided with their size.

    >>> p = lambda r, pid=None: Proc("s", None, pid, r, None, None, None, True, False)
    >>> who([p(0), p(1), p(2), p(5)]), who([p(7)]), who([p(None, 11), p(1), p(None, 12)])
    ('ranks 0-2,5', 'rank 7', 'rank 1, pids 11,12')
    >>> who([p(r) for r in range(0, 4096, 2)])
    'ranks 0,2,4,6,8,10,12,…,4094 (2048 ranks)'
    """
    ranks: set[int] = set()
    pids: set[int] = set()
    for p in procs:
        if p.rank is not None:
            ranks.add(p.rank)
        elif p.pid is not None:
            pids.add(p.pid)
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {short_ranks(ranks, limit)}")
    if pids:
        shown = sorted(pids)
        more = f",… ({len(shown)} pids)" if len(shown) > limit else ""
        parts.append(f"pid{'s' if len(pids) > 1 else ''} "
                     f"{','.join(str(p) for p in shown[:limit - 1])}{more}")
    return ", ".join(parts) or "unknown process"


@dataclass(eq=False)
class Node:
    """A run of frames shared by the same processes; the root has no frames and holds them all.

    The tree is path-compressed: a chain of frames that no process leaves or branches off is one
    node, so 4096 identical 40-frame stacks make one node, not 40.
    """

    frames: tuple[Frame, ...]  # outermost first
    members: tuple[int, ...]  # indices into StackTree.procs, sorted
    label: str
    children: list[Node] = field(default_factory=list)
    #: Members whose innermost frame is this node's last frame (where they are right now).
    ends: tuple[int, ...] = ()
    #: Indices into StackTree.classes of the classes passing through this node.
    classes: tuple[int, ...] = ()
    #: Indices of the classes whose stacks end here (at most one: a class is a path).
    ending: tuple[int, ...] = ()
    #: Every member belongs to an outlier class.
    outlier: bool = False
    #: For thread trees: the pseudo-node that groups threads by name.
    thread: str | None = None

    @property
    def count(self) -> int:
        return len(self.members)

    def walk(self, depth: int = 0) -> Iterator[tuple[int, Node]]:
        """Every node below (and including) this one, depth first, with its depth."""
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "frames": [_frame_dict(f) for f in self.frames],
            "thread": self.thread,
            "label": self.label,
            "count": self.count,
            "here": len(self.ends),
            "outlier": self.outlier,
            "children": [c.to_dict() for c in self.children],
        }


def is_library(frame: Frame) -> bool:
    """A frame in torch, the standard library, site-packages or native code (not the user's
    own code)."""
    return frame.native or bool(LIBRARY_FILE.search(frame.file or ""))


def is_collective(frame: Frame) -> bool:
    """A torch.distributed call that blocks until the other ranks arrive."""
    return frame.func in COLLECTIVES and "torch/distributed" in (frame.file or "")


@dataclass(eq=False)
class StackClass:
    """Processes whose main-thread stacks are identical."""

    id: str  # "S1", "S2"... largest first
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them
    members: tuple[int, ...]
    label: str
    idle: int  # how many members py-spy saw idle
    collective: Frame | None  # the torch.distributed call it waits in, if any
    user_frame: Frame | None  # innermost frame of the user's code
    place: str | None  # "evaluation", "data loading", ... (stackview.PLACES)
    outlier: bool = False
    #: For outliers: the innermost frame shared with the largest class (None: nothing shared).
    diverges_at: Frame | None = None
    threads: tuple[str, ...] = ()  # thread names (thread trees)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def innermost(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "size": self.size,
            "idle": self.idle,
            "collective": self.collective.func if self.collective else None,
            "user_frame": _frame_dict(self.user_frame),
            "place": self.place,
            "outlier": self.outlier,
            "diverges_at": _frame_dict(self.diverges_at),
            "threads": list(self.threads),
            "frames": [_frame_dict(f) for f in self.frames],
        }


@dataclass(eq=False)
class StackTree:
    """The merged stacks of one group of processes (see the module docstring)."""

    procs: list[Proc]
    root: Node
    classes: list[StackClass]
    granularity: Granularity = "line"
    #: Threads other than the main one that run or hold the GIL, merged by thread name.
    threads: StackTree | None = None
    #: Processes kept out of this tree, by role (agent, dataloader, other), merged per role.
    side: dict[str, StackTree] = field(default_factory=dict)

    @property
    def outliers(self) -> list[StackClass]:
        return [c for c in self.classes if c.outlier]

    @property
    def majority(self) -> StackClass | None:
        """The largest class, when it is strictly larger than the next one."""
        if not self.classes or (len(self.classes) > 1
                                and self.classes[1].size == self.classes[0].size):
            return None
        return self.classes[0]

    @property
    def label(self) -> str:
        return self.root.label

    def __len__(self) -> int:
        return len(self.procs)

    def members(self, idx: Iterable[int]) -> list[Proc]:
        return [self.procs[i] for i in idx]

    def by_rank(self) -> dict[int, StackClass]:
        """Rank → the class of its main thread (ranks with several dumps: the first)."""
        out: dict[int, StackClass] = {}
        for c in self.classes:
            for m in c.members:
                rank = self.procs[m].rank
                if rank is not None:
                    out.setdefault(rank, c)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "granularity": self.granularity,
            "processes": len(self.procs),
            "label": self.root.label,
            "classes": [c.to_dict() for c in self.classes],
            "outliers": [c.id for c in self.outliers],
            "tree": self.root.to_dict(),
            "threads": self.threads.to_dict() if self.threads else None,
            "side": {role: t.to_dict() for role, t in self.side.items()},
        }


def _frame_dict(f: Frame | None) -> dict[str, Any] | None:
    return None if f is None else {"func": f.func, "file": f.file, "line": f.line,
                                   "native": f.native}


def empty() -> StackTree:
    return StackTree(procs=[], root=Node(None, (), "no processes"), classes=[])


def build(stacks: pl.DataFrame, processes: pl.DataFrame | None = None, *,
          granularity: Granularity = "line", side_roles: Sequence[str] = SIDE_ROLES,
          all_threads: bool = False) -> StackTree:
    """Merge the main threads of ``stacks`` (see the module docstring).

    ``granularity="function"`` merges frames of the same function at different lines.
    ``side_roles``: processes with one of these ``processes`` roles go to :attr:`~StackTree.side`.
    ``all_threads``: put every non-main thread in :attr:`~StackTree.threads`, idle ones too.
    """
    if stacks.height == 0:
        return empty()
    df = _keyed(stacks, granularity)
    roles = _roles(processes)
    threads = (
        df.group_by("_p", "thread_id", maintain_order=True)
        .agg(pl.col("_i").min().alias("_first"),
             pl.col("source", "host", "pid", "rank", "local_rank", "thread_name", "idle",
                    "owns_gil").first())
        .with_columns(
            pl.when(pl.col("thread_id") == pl.col("pid")).then(0)
            .when(pl.col("thread_name") == "MainThread").then(1)
            .otherwise(2).alias("_prio")
        )
        .sort("_p", "_prio", "_first")
        .with_columns((pl.int_range(pl.len()).over("_p") == 0).alias("_main"))
    )
    procs = {row["_p"]: row for row in threads.filter("_main").iter_rows(named=True)}
    role_of = {p: roles.get((row["host"], row["pid"])) or roles.get((None, row["pid"]))
               for p, row in procs.items()} if roles else {}
    side = {p for p, role in role_of.items() if role in side_roles}

    frames = frames_of(df)
    main_keys = threads.filter("_main").select("_p", "thread_id")
    main_rows = df.join(main_keys, on=["_p", "thread_id"], how="semi", nulls_equal=True)
    workers = main_rows.filter(~pl.col("_p").is_in(list(side))) if side else main_rows
    tree = _merge(workers, frames, role_of, granularity)

    other = df.join(main_keys, on=["_p", "thread_id"], how="anti", nulls_equal=True)
    if side:
        other = other.filter(~pl.col("_p").is_in(list(side)))
    if not all_threads:
        busy = (other.group_by("_p", "thread_id")
                .agg((~pl.col("idle").first() | pl.col("owns_gil").first()).alias("_busy"))
                .filter("_busy").drop("_busy"))
        other = other.join(busy, on=["_p", "thread_id"], how="semi", nulls_equal=True)
    if other.height:
        tree.threads = _merge(other, frames, role_of, granularity, by_thread=True)
    for role in side_roles:
        ps = [p for p in side if role_of.get(p) == role]
        if ps:
            tree.side[role] = _merge(main_rows.filter(pl.col("_p").is_in(ps)), frames, role_of,
                                     granularity)
    return tree


def from_job(job: Any) -> StackTree:
    """The merged tree of a :class:`~ddp_autopsy.analyzer.job.Job` (its ``stack_tree`` fact:
    built once per job)."""
    return job.stack_tree


# --------------------------------------------------------------------------- internals


def _keyed(stacks: pl.DataFrame, granularity: Granularity) -> pl.DataFrame:
    """Add ``_i`` (row), ``_p`` (process id) and ``_f`` (frame id) columns."""
    if "native" not in stacks.columns:  # a frame built before native frames existed
        stacks = stacks.with_columns(pl.lit(False).alias("native"))
    if "args" not in stacks.columns:  # nor call arguments
        stacks = stacks.with_columns(pl.lit(None, dtype=pl.String).alias("args"))
    df = stacks.with_row_index("_i").with_columns(
        pl.col("file").fill_null(""), pl.col("func").fill_null("?"),
        pl.col("idle").fill_null(True), pl.col("owns_gil").fill_null(False),
        pl.col("native").fill_null(False),
    )
    if granularity == "function":
        df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias("line"))
    key = ["func", "file", "line", "native"]
    procs = df.select("source", "pid").unique(maintain_order=True).with_row_index("_p")
    frames = df.select(key).unique(maintain_order=True).with_row_index("_f")
    return (df.join(procs, on=["source", "pid"], how="left", nulls_equal=True)
            .join(frames, on=key, how="left", nulls_equal=True))


def frames_of(df: pl.DataFrame) -> dict[int, Frame]:
    """Frame id → Frame, for a frame produced by :func:`_keyed`."""
    rows = df.select("_f", "func", "file", "line", "native").unique("_f")
    return {f: Frame(func, file, line, bool(native))
            for f, func, file, line, native in rows.iter_rows()}


def _roles(processes: pl.DataFrame | None) -> dict[tuple[str | None, int], str]:
    if processes is None or processes.height == 0:
        return {}
    out: dict[tuple[str | None, int], str] = {}
    for host, pid, role in processes.select("host", "pid", "role").iter_rows():
        if pid is not None and role:
            out[(host, pid)] = role
            out.setdefault((None, pid), role)
    return out


def _merge(rows: pl.DataFrame, frames: dict[int, Frame], role_of: dict[int, str | None],
           granularity: Granularity, by_thread: bool = False) -> StackTree:
    """Prefix-merge the threads in ``rows`` (each (_p, thread_id) is one member)."""
    if rows.height == 0:
        return empty()
    paths = (
        rows.sort("_p", "thread_id", "depth", descending=[False, False, True])
        .group_by("_p", "thread_id", maintain_order=True)
        .agg(pl.col("_f").alias("_full"),
             pl.col("_f").filter(~pl.col("native")).alias("_path"),
             pl.col("source", "host", "pid", "rank", "local_rank", "thread_name", "idle",
                    "owns_gil").first(),
             pl.col("args").drop_nulls().last())  # the innermost call's (outermost first)
        .sort("rank", "pid", "_p", "thread_id", nulls_last=True)
    )
    procs: list[Proc] = []
    for row in paths.iter_rows(named=True):
        procs.append(Proc(
            source=row["source"], host=row["host"], pid=row["pid"], rank=row["rank"],
            local_rank=row["local_rank"], thread_id=row["thread_id"],
            thread_name=row["thread_name"], idle=bool(row["idle"]),
            owns_gil=bool(row["owns_gil"]), role=role_of.get(row["_p"]), args=row["args"],
        ))
    paths = paths.with_row_index("_m")
    if by_thread:
        paths = paths.with_columns(pl.col("thread_name").fill_null("(unnamed)"))
        keys = ["thread_name", "_path"]
    else:
        keys = ["_path"]
    groups = (paths.group_by(keys, maintain_order=True)
              .agg(pl.col("_m").alias("_members"))
              .with_columns(pl.col("_members").list.len().alias("_n"),
                            pl.col("_members").list.min().alias("_lo"))
              .sort(["_n", "_lo"], descending=[True, False]))

    full = paths["_full"].to_list()
    classes: list[StackClass] = []
    class_paths: list[list[int]] = []  # Python frames: they decide classes and outliers
    tree_paths: list[list[int]] = []  # with the native frames: what the tree shows
    thread_ids: dict[str, int] = {}  # thread trees: a negative pseudo frame id per thread name
    for n, row in enumerate(groups.iter_rows(named=True), 1):
        members = tuple(sorted(row["_members"]))
        path = list(row["_path"])
        shown = list(row["_path"])
        if any(len(full[m]) != len(path) for m in members):
            # native frames: the most common full stack (ties: the first member's), less the
            # ones outside the outermost Python frame (_start, Py_BytesMain: no news)
            shown = list(Counter(tuple(full[m]) for m in members).most_common(1)[0][0])
            while path and frames[shown[0]].native:
                shown.pop(0)
        inner_first = tuple(frames[f] for f in reversed(path))
        mem = [procs[m] for m in members]
        first = mem[0]
        view = RankStack(first.rank, first.pid, first.host, first.source, first.idle,
                         list(inner_first))
        classes.append(StackClass(
            id=f"S{n}", frames=inner_first, members=members, label=who(mem),
            idle=sum(p.idle for p in mem), collective=view.collective,
            user_frame=view.user_frame, place=view.place,
            threads=(row["thread_name"],) if by_thread else (),
        ))
        if by_thread:
            pseudo = thread_ids.setdefault(row["thread_name"], -1 - len(thread_ids))
            path, shown = [pseudo, *path], [pseudo, *shown]
        class_paths.append(path)
        tree_paths.append(shown)
    _mark_outliers(classes, class_paths, offset=1 if by_thread else 0)
    root = _trie(classes, tree_paths, procs, frames, by_thread)
    return StackTree(procs=procs, root=root, classes=classes, granularity=granularity)


def _mark_outliers(classes: list[StackClass], paths: list[list[int]], offset: int) -> None:
    """Flag the small classes; ``offset`` pseudo frames lead each path (thread names)."""
    if len(classes) < 2:
        return
    top, top_path = classes[0], paths[0]
    for cls, path in zip(classes[1:], paths[1:], strict=True):
        if cls.size <= top.size * OUTLIER_RATIO:
            cls.outlier = True
            shared = 0
            for a, b in zip(path, top_path, strict=False):
                if a != b:
                    break
                shared += 1
            shared -= offset
            # path is outermost first; frames innermost first.
            cls.diverges_at = cls.frames[len(cls.frames) - shared] if shared > 0 else None


@dataclass(eq=False)
class _Build:
    """A radix-tree node under construction: ``seg`` is its run of frame ids."""

    seg: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)
    classes: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    children: dict[int, _Build] = field(default_factory=dict)
    thread: str | None = None
    ending: list[int] = field(default_factory=list)

    def add(self, ci: int, members: tuple[int, ...]) -> None:
        self.members.extend(members)
        self.classes.append(ci)

    def split(self, k: int) -> None:
        """Keep ``seg[:k]`` here and move the rest (and everything below) to one child."""
        tail = _Build(self.seg[k:], list(self.members), list(self.classes), self.ends,
                      self.children, ending=self.ending)
        self.seg, self.ends, self.children = self.seg[:k], [], {tail.seg[0]: tail}
        self.ending = []


def _trie(classes: list[StackClass], paths: list[list[int]], procs: list[Proc],
          frames: dict[int, Frame], by_thread: bool) -> Node:
    """Radix-insert every class path (outermost frame first) under one root."""
    root = _Build()
    for ci, (cls, full) in enumerate(zip(classes, paths, strict=True)):
        node, path = root, full
        node.add(ci, cls.members)
        if by_thread:  # a pseudo node per thread name, never merged with frames
            node = node.children.setdefault(path[0], _Build(thread=cls.threads[0]))
            node.add(ci, cls.members)
            path = path[1:]
        while path:
            child = node.children.get(path[0])
            if child is None:
                child = node.children[path[0]] = _Build(list(path))
                child.add(ci, cls.members)
                node, path = child, []
                break
            k, limit = 1, min(len(child.seg), len(path))
            while k < limit and child.seg[k] == path[k]:
                k += 1
            if k < len(child.seg):
                child.split(k)
            child.add(ci, cls.members)
            node, path = child, path[k:]
        node.ends.extend(cls.members)
        node.ending.append(ci)

    def freeze(b: _Build) -> Node:
        members = tuple(sorted(b.members))
        cls_idx = tuple(b.classes)
        node = Node(
            frames=tuple(frames[f] for f in b.seg),
            members=members,
            label=who(procs[m] for m in members) if members else "no processes",
            ends=tuple(sorted(b.ends)),
            classes=cls_idx,
            ending=tuple(b.ending),
            outlier=bool(cls_idx) and all(classes[c].outlier for c in cls_idx),
            thread=b.thread,
        )
        kids = [freeze(c) for c in b.children.values()]
        kids.sort(key=lambda n: (-n.count, n.members[0] if n.members else 0))
        node.children = kids
        return node

    return freeze(root)
