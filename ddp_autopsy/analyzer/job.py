"""Load everything the user gave into one :class:`Job`: typed polars frames plus input notes.

Frames (documented in docs/frames.md):

- ``events``: one row per recognised log line (see ``events.EVENT_SCHEMA``)
- ``stacks``: one row per stack frame of every dumped thread (see ``stacks.STACK_SCHEMA``)
- ``ranks``: one row per known global rank: host, local rank, pid, what we have of it
- ``env``: environment and versions per process, from collect bundles
- ``processes``: processes a bundle saw (pid, role, rank, stack status)
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from ddp_autopsy import __version__
from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.analyzer import attribution, snapshots
from ddp_autopsy.analyzer.deferred import DeferredSchema
from ddp_autopsy.analyzer.events import (
    EVENT_SCHEMA,
    FileContext,
    Presifter,
    ScanStats,
    Sifted,
    scan_text,
)
from ddp_autopsy.analyzer.facts import FACTS
from ddp_autopsy.analyzer.flight_recorder import (
    FRDump,
    FRFrames,
    build_frames,
    looks_like_dump,
    read_dump,
)
from ddp_autopsy.analyzer.fr_reader import DumpFile, read_files
from ddp_autopsy.analyzer.layout import attribution_from_path
from ddp_autopsy.analyzer.patterns import catalog_hash, kinds_tagged
from ddp_autopsy.analyzer.sources import (
    READ_ERRORS,
    SKIP_SUFFIXES,
    InputNote,
    Member,
    Tree,
    compressed_name,
    decompressed,
    iter_inputs,
)
from ddp_autopsy.analyzer.stacks import (
    STACK_SCHEMA,
    StackOwner,
    StackParseError,
    looks_like_pyspy_json,
    looks_like_pyspy_text,
    parse_pyspy_json,
    parse_pyspy_text,
)

MAX_DUMP_BYTES = 512 << 20

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.collectives import CollectiveReport
    from ddp_autopsy.analyzer.crashes import Crashes
    from ddp_autopsy.analyzer.stacktree import StackTree

#: Event kinds that mean something failed (used to tell a recovered run from a failed one).
FAILURE_KINDS = frozenset(kinds_tagged("failure"))

ENV_SCHEMA: Mapping[str, Any] = DeferredSchema(lambda: {
    "host": pl.String, "pid": pl.Int64, "rank": pl.Int64, "key": pl.String, "value": pl.String,
})
PROCESS_SCHEMA: Mapping[str, Any] = DeferredSchema(lambda: {
    "bundle": pl.String, "host": pl.String, "pid": pl.Int64, "ppid": pl.Int64,
    "role": pl.String, "rank": pl.Int64, "local_rank": pl.Int64, "world_size": pl.Int64,
    "stack_status": pl.String, "proc_state": pl.String,
})


@dataclass
class InputRecord:
    """One file that was read, and how."""

    path: str
    kind: str  # log | stack | bundle-manifest | skipped
    lines: int = 0
    bytes: int = 0
    events: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "lines": self.lines,
                "bytes": self.bytes, "events": self.events}


@dataclass
class Bundle:
    """A collect bundle: its manifest and the probes it recorded."""

    display: str
    manifest: dict[str, Any]
    probes: list[dict[str, Any]] = field(default_factory=list)
    host_info: dict[str, Any] = field(default_factory=dict)
    #: packet-filter dumps by tool (``bundle_layout.FIREWALL``): analyzer/firewall.py reads them
    firewall: dict[str, str] = field(default_factory=dict)


@dataclass
class Job:
    events: pl.DataFrame
    stacks: pl.DataFrame
    ranks: pl.DataFrame
    env: pl.DataFrame
    processes: pl.DataFrame
    inputs: list[InputRecord] = field(default_factory=list)
    notes: list[InputNote] = field(default_factory=list)
    bundles: list[Bundle] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: Flight Recorder frames (docs/frames.md): entries, dump files, per-group counters.
    collectives: pl.DataFrame = field(default_factory=lambda: FRFrames.empty().collectives)
    fr_dumps: pl.DataFrame = field(default_factory=lambda: FRFrames.empty().dumps)
    fr_groups: pl.DataFrame = field(default_factory=lambda: FRFrames.empty().groups)
    #: Ranks whose main thread moved, or not, between stack snapshots of the same processes
    #: (several bundles of one job, or the earlier samples ``watch`` keeps): analyzer/snapshots.py.
    snapshot_moves: list[Any] = field(default_factory=list)
    #: How many times each derived fact was built (once per job; tests count).
    fact_builds: Counter[str] = field(default_factory=Counter, init=False, repr=False)
    _facts: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _rows: dict[tuple[tuple[str, ...], bool], list[dict[str, Any]]] = field(
        default_factory=dict, init=False, repr=False)
    #: Per ``history``: the frame, each kind's row positions, each row decoded once when asked.
    _decoded: dict[bool, tuple[pl.DataFrame, dict[str, list[int]], list[Any]]] = field(
        default_factory=dict, init=False, repr=False)
    _history: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None = field(
        default=None, init=False, repr=False)
    _restarts: tuple[pl.DataFrame, dict[str, int]] | None = field(default=None, init=False,
                                                                   repr=False)
    _world: tuple[pl.DataFrame, int | None] | None = field(default=None, init=False,
                                                           repr=False)

    def frame(self, name: str) -> pl.DataFrame:
        return getattr(self, name)

    # --- derived facts (analyzer/facts.py): each built at most once ---------------------------

    def fact(self, name: str) -> Any:
        """The derived fact ``name`` (see :data:`~ddp_autopsy.analyzer.facts.FACTS`), built on
        first use and cached (replacing a frame starts the cache over)."""
        frames = (id(self.events), id(self.stacks), id(self.collectives), id(self.processes))
        if self._facts.get("_frames") != frames:  # a frame was replaced: start over
            self.forget()
            self._facts["_frames"] = frames
        if name not in self._facts:
            spec = FACTS[name]
            self.fact_builds[name] += 1
            self._facts[name] = spec.build(self)
        return self._facts[name]

    def forget(self) -> None:
        """Drop every derived fact (after a frame was replaced)."""
        self._facts.clear()
        self._rows.clear()
        self._decoded.clear()
        self._history = None
        self._world = None

    @property
    def stack_tree(self) -> StackTree:
        return self.fact("stack_tree")

    @property
    def collective_report(self) -> CollectiveReport:
        return self.fact("collective_report")

    @property
    def crashes(self) -> Crashes:
        return self.fact("crashes")

    @property
    def rank_state(self) -> pl.DataFrame:
        """The per-rank table (analyzer/rankstate.py)."""
        return self.fact("rank_state")

    @property
    def active_events(self) -> pl.DataFrame:
        """``events`` without the rows a later clean restart made history."""
        return self.fact("active_events")

    @property
    def readable(self) -> bool:
        """Whether anything in the inputs could be read (not only skipped files)."""
        return any(rec.kind != "skipped" for rec in self.inputs)

    def has(self, name: str) -> bool:
        """Whether the inputs held this kind of data, or what a derived fact is made of (logs
        that matched nothing still count: rules over ``events`` then rule out rather than go
        unevaluated)."""
        if name in FACTS:
            return FACTS[name].available(self)
        if name == "events":
            return any(rec.kind == "log" for rec in self.inputs)
        if name == "collectives":
            return self.fr_dumps.height > 0
        if name == "bundles":
            return bool(self.bundles)
        df = getattr(self, name, None)
        return isinstance(df, pl.DataFrame) and df.height > 0

    def of_kind(self, *kinds: str, history: bool = False) -> pl.DataFrame:
        """Events of these kinds; with ``history``, also those a later clean restart made
        history (see :meth:`superseded`)."""
        events = self.events if history else self.active_events
        return events.filter(pl.col("kind").is_in(list(kinds)))

    def rows(self, *kinds: str, history: bool = False) -> list[dict[str, Any]]:
        """Events of these kinds as dicts, ``data`` decoded, in input order (decoded once per
        job; the dicts are shared: read them, do not change them)."""
        key = (kinds, history)
        if key not in self._rows:
            self._rows[key] = self._rows_of(kinds, history)
        return list(self._rows[key])

    def _rows_of(self, kinds: tuple[str, ...], history: bool) -> list[dict[str, Any]]:
        """``of_kind(*kinds)`` decoded, each event at most once whatever the kinds asked with
        it (rules ask for ~80 sets of kinds: at 1024 ranks each watchdog timeout was decoded
        six times)."""
        events = self.events if history else self.active_events
        got = self._decoded.get(history)
        if got is None or got[0] is not events:
            where: dict[str, list[int]] = {}
            for i, kind in enumerate(events["kind"].to_list()):
                where.setdefault(kind, []).append(i)
            got = self._decoded[history] = (events, where, [None] * events.height)
        _, where, done = got
        at = sorted(i for kind in set(kinds) for i in where.get(kind, ()))
        todo = [i for i in at if done[i] is None]
        if todo:
            for i, row in zip(todo, self.decoded_rows(events[todo]), strict=True):
                done[i] = row
        return [done[i] for i in at]

    def history_split(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(active, history): failures before their source's last clean run start (a run
        start with no failure after it) are history; context lines stay active."""
        if self._history is None or self._history[0] is not self.events:
            starts = self._clean_restarts()
            if not starts:
                active, old = self.events, self.events.clear()
            else:
                first, start = (pl.col("source").replace_strict(
                    {src: pair[i] for src, pair in starts.items()}, default=None,
                    return_dtype=pl.Int64) for i in (0, 1))
                old_rows = start.is_not_null() & pl.col("line").is_not_null() \
                    & (pl.col("line") > first) & (pl.col("line") < start) \
                    & pl.col("kind").is_in(list(FAILURE_KINDS))
                active = self.events.filter(~old_rows)
                old = self.events.filter(old_rows)
            self._history = (self.events, active, old)
        return self._history[1], self._history[2]

    @staticmethod
    def decoded_rows(events: pl.DataFrame) -> list[dict[str, Any]]:
        """Rows of (a part of) the events frame as dicts, ``data`` decoded."""
        out = list(events.iter_rows(named=True))
        # one json.loads for them all (3x faster than one a row)
        datas = json.loads("[" + ",".join(row["data"] or "{}" for row in out) + "]")
        if len(datas) != len(out):  # (a data that is not one JSON value: decode one by one)
            datas = [json.loads(row["data"]) if row["data"] else {} for row in out]
        for row, data in zip(out, datas, strict=True):
            row["data"] = data
        return out

    def lines_in(self, source: str) -> int:
        for rec in self.inputs:
            if rec.path == source:
                return rec.lines
        return 0

    def superseded(self, source: str, line: int) -> bool:
        """Whether a failure at ``source:line`` was followed by a restart that did not fail.

        A later run start (torchrun's banner, Lightning's rank init, ...) in the same source with
        no failure after it means the user re-ran the job and the earlier failure is history.
        """
        starts = self._clean_restarts().get(source)
        return starts is not None and starts[0] < line < starts[1]

    def _clean_restarts(self) -> dict[str, tuple[int, int]]:
        """Per source, ``(after, start)``: failures between those lines are history, ``start``
        being its last run start when no failure follows it (computed once per events frame:
        rules ask for every failure line). The rerun must have printed more than its
        launcher's banner for what came before to be an earlier run's (``after`` 0); else only
        a failure between two run starts is (``after`` the first start): a worker's error
        pasted above the only banner belongs to the run the banner opened."""
        if self._restarts is None or self._restarts[0] is not self.events:
            starts = (self.events.lazy().filter(pl.col("kind") == "run_start")
                      .group_by("source").agg(pl.col("line").min().alias("first"),
                                              pl.col("line").max().alias("start")))
            ran = (self.events.lazy().join(starts, on="source")
                   .filter((pl.col("line") > pl.col("start")) & (pl.col("kind") != "run_start")
                           & pl.col("text").str.contains(r"[A-Za-z0-9]"))
                   .select("source").unique().with_columns(pl.lit(True).alias("ran")))
            last = (starts.join(ran, on="source", how="left")
                    .with_columns(pl.when(pl.col("ran")).then(0).otherwise(pl.col("first"))
                                  .alias("first"))
                    .filter(pl.col("first") < pl.col("start")))
            failed = (self.events.lazy()
                      .filter(pl.col("kind").is_in(list(FAILURE_KINDS)))
                      .join(last, on="source")
                      .filter(pl.col("line") > pl.col("start"))
                      .select("source").unique())
            clean = last.join(failed, on="source", how="anti").collect()
            self._restarts = (self.events, {
                src: (first, start) for src, first, start in
                clean.select("source", "first", "start").iter_rows()})
        return self._restarts[1]

    @property
    def world_size(self) -> int | None:
        """The job's world size where any input states it (computed once per events frame)."""
        if self._world is None or self._world[0] is not self.events:
            self._world = (self.events, self._world_size())
        return self._world[1]

    def _world_size(self) -> int | None:
        sizes: list[int] = []
        for b in self.bundles:
            ws = (b.manifest.get("job") or {}).get("world_size")
            if isinstance(ws, int):
                sizes.append(ws)
        if self.processes.height:
            sizes += [int(x) for x in self.processes["world_size"].drop_nulls().to_list()]
        for row in self.of_kind("store_clients_timeout", history=True).iter_rows(named=True):
            sizes.append(json.loads(row["data"])["world"])
        # (at least the size of its NCCL communicator, "comm 0x.. rank 1 nranks 4", when the
        # inputs show one size only: several are sub-groups' or an elastic restart's, which may
        # have shrunk the job)
        inits = self.of_kind("nccl_comm_init", history=True)
        if inits.height:
            nranks = inits.select(pl.col("data").str.json_path_match("$.nranks")
                                  .cast(pl.Int64, strict=False).drop_nulls().unique())
            if nranks.height == 1:
                sizes.append(nranks.item())
        # (at least the size of a group whose all-gather or reduce-scatter sizes show it)
        if gathered := attribution.gathered_group_size(self.events):
            sizes.append(gathered)
        if self.of_kind("spawn_failed").height:
            # torch.multiprocessing.spawn tears down every other child after one failed
            # ("Terminating process N via signal SIGTERM"): they and the failed one are the job
            closing = self.of_kind("closing_signal").filter(
                pl.col("text").str.contains("Terminating process", literal=True))
            stopped = {json.loads(d).get("pid") for d in closing["data"]} - {None}
            if stopped:
                sizes.append(len(stopped) + 1)
        return max(sizes) if sizes else None


def _year_of(member: Member) -> int:
    ts = member.mtime or time.time()
    return datetime.fromtimestamp(ts).year


def _context(member: Member, host: str | None = None,
             ref: datetime | None = None) -> FileContext:
    """A file's context; year-less stamps are dated against ``ref`` (a bundle's collection
    time) or the file's modification time."""
    when = ref or (datetime.fromtimestamp(member.mtime) if member.mtime else None)
    return FileContext(member.display, _year_of(member), host=host, ref_time=when)


def processes_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=PROCESS_SCHEMA) if rows else pl.DataFrame(
        schema=PROCESS_SCHEMA)


def load(paths: Iterable[Path | str], *, use_summaries: bool = True,
         meanwhile: Callable[[], None] | None = None) -> Job:
    """Read every PATH (files, directories, archives, bundles) into one Job.

    Bundles whose manifest lists pre-parsed ``summaries`` are read from those instead of their
    raw logs, unless ``use_summaries`` is False. ``meanwhile`` is called once: while worker
    processes read (this process would wait for them), else after the files were read; what
    it raises stops the reading (workers stopped) and leaves ``load``."""
    t0 = time.perf_counter()
    notes: list[InputNote] = []
    inputs: list[InputRecord] = []
    event_rows: list[dict[str, Any]] = []
    stack_rows: list[dict[str, Any]] = []
    env_rows: list[dict[str, Any]] = []
    proc_rows: list[dict[str, Any]] = []
    bundles: list[Bundle] = []
    summary_frames: list[pl.DataFrame] = []
    dumps: list[FRDump | DumpFile] = []  # files on disk are read together, after the walk
    bundle_trees: list[tuple[Tree, Bundle]] = []

    for _path, tree in iter_inputs([Path(p) for p in paths], notes):
        found, loose = _split_bundles(tree, notes)
        for sub, bundle in found:
            bundles.append(bundle)
            bundle_trees.append((sub, bundle))
            if use_summaries and _load_summaries(sub, bundle, notes, inputs, summary_frames):
                bundle.manifest = {**bundle.manifest, "logs": []}
            _load_bundle(sub, bundle, notes, inputs, event_rows, stack_rows, env_rows, proc_rows,
                         dumps)
        with _presifter(loose) as ahead:
            if meanwhile is not None and ahead.forked:
                meanwhile, now = None, meanwhile
                now()
            for member in loose:
                _load_member(member, _context(member), notes, inputs, event_rows, stack_rows,
                             dumps=dumps, presifted=ahead.take(member))
            notes += ahead.notes  # worker processes that died or hung (their files read here)
    if meanwhile is not None:
        meanwhile()

    events = pl.DataFrame(event_rows, schema=EVENT_SCHEMA, orient="row") if event_rows \
        else pl.DataFrame(schema=EVENT_SCHEMA)
    if summary_frames:
        events = pl.concat([events, *summary_frames], how="vertical_relaxed")
    events = attribution.resolve(events, processes_frame(proc_rows))
    stacks = pl.DataFrame(stack_rows, schema=STACK_SCHEMA) if stack_rows \
        else pl.DataFrame(schema=STACK_SCHEMA)
    env = pl.DataFrame(env_rows, schema=ENV_SCHEMA) if env_rows else pl.DataFrame(schema=ENV_SCHEMA)
    processes = processes_frame(proc_rows)
    job = Job(events=events, stacks=stacks, ranks=pl.DataFrame(), env=env, processes=processes,
              inputs=inputs, notes=notes, bundles=bundles)
    if dumps:
        read = _read_dumps(dumps)
        fr = build_frames(read)
        job.collectives, job.fr_dumps, job.fr_groups = fr.collectives, fr.dumps, fr.groups
        notes += [InputNote(d.source, d.note() or "",
                            "info" if d.status == "duplicate" else "warning")
                  for d in read if not d.ok and d.note()]
    job, repeated = snapshots.merge_repeated(job)  # one set of processes, however many bundles
    moves = repeated + [m for tree, b in bundle_trees
                        for m in snapshots.movement(snapshots.read_tree(tree, b.manifest))]
    job.snapshot_moves = snapshots.one_per_process(moves)
    job.ranks = _ranks_frame(job)
    job.elapsed_s = time.perf_counter() - t0
    return job


def _read_dumps(dumps: list[FRDump | DumpFile]) -> list[FRDump]:
    """The dumps in input order, those still on disk read now (on two cores when many)."""
    files = [d for d in dumps if isinstance(d, DumpFile)]
    read = iter(read_files(files))
    return [next(read) if isinstance(d, DumpFile) else d for d in dumps]


def _skipped(member: Member) -> bool:
    lower = member.relpath.lower()
    return any(lower.endswith(s) for s in SKIP_SUFFIXES)


def _pyspy_text_head(head: bytes) -> bool:
    """The cheap test before :func:`looks_like_pyspy_text`: its header, or a paste of its
    threads that starts with one."""
    return b"Python v" in head or head.lstrip().startswith(b"Thread ")


def _is_text(head: bytes, member: Member) -> bool:
    """Whether a file whose first bytes are ``head`` is read as a log (not a Flight Recorder
    dump, not a py-spy dump: see :func:`_load_member`)."""
    return not (looks_like_dump(head, member.relpath) or looks_like_pyspy_json(head)
                or (_pyspy_text_head(head) and looks_like_pyspy_text(head)))


#: Below this many files, each is read on its own (no reader thread to start).
PRESIFT_FILES = 4


def _presifter(members: list[Member]) -> Presifter:
    """Small plain files of ``members`` read, sifted and classified ahead, many to a batch, on
    both cores (in the context :func:`_load_member` gives them)."""
    files = [(m, m.opener, m.size) for m in members
             if m.path is not None and not compressed_name(m.relpath) and not _skipped(m)]
    return Presifter(files if len(files) >= PRESIFT_FILES else [], _is_text,
                     lambda m: _with_path_cues(m, _context(m)))


def _with_path_cues(member: Member, ctx: FileContext) -> FileContext:
    """``ctx`` with the writer its path names, unless it names one already."""
    cue = attribution_from_path(member.display)  # the path as given: a node's directory too
    if ctx.rank is None and ctx.local_rank is None and cue.cue:
        ctx.rank, ctx.local_rank, ctx.cue = cue.rank, cue.local_rank, cue.cue
        ctx.host = ctx.host or cue.host
        ctx.pid = ctx.pid or cue.pid
    return ctx


def _load_member(member: Member, ctx: FileContext, notes: list[InputNote],
                 inputs: list[InputRecord], event_rows: list[dict[str, Any]],
                 stack_rows: list[dict[str, Any]], owner: StackOwner | None = None,
                 dumps: list[FRDump | DumpFile] | None = None,
                 presifted: Sifted | None = None) -> None:
    """Read one file: a log, a stack dump or a Flight Recorder dump (``presifted``: a log that
    :class:`~ddp_autopsy.analyzer.events.Presifter` read and sifted already)."""
    if _skipped(member):
        inputs.append(InputRecord(member.display, "skipped"))
        notes.append(InputNote(member.display, "not a log (by its file type), skipped", "info"))
        return
    _with_path_cues(member, ctx)
    if presifted is not None:
        stats = ScanStats()
        rows = scan_text(None, ctx, notes, stats, presifted)
        event_rows.extend(rows)
        inputs.append(InputRecord(member.display, "log", stats.lines, stats.bytes, len(rows)))
        return
    try:
        with decompressed(member) as fh:
            head = fh.read(65536)
            if dumps is not None and looks_like_dump(head, member.relpath):
                if member.path is not None and not compressed_name(member.relpath):
                    dumps.append(DumpFile(member.path, member.display, ctx.host))
                    inputs.append(InputRecord(member.display, "flight-recorder",
                                              bytes=member.size or 0))
                    return
                data = head + fh.read(MAX_DUMP_BYTES)
                dumps.append(read_dump(data, member.display, host=ctx.host, mtime=member.mtime))
                inputs.append(InputRecord(member.display, "flight-recorder", bytes=len(data)))
                return
            if looks_like_pyspy_json(head) or (_pyspy_text_head(head)  # the cheap test first
                                               and looks_like_pyspy_text(head)):
                data = head + fh.read()
                own = owner or StackOwner(member.display, ctx.host, ctx.pid, ctx.rank,
                                          ctx.local_rank)
                try:
                    if looks_like_pyspy_json(head):
                        rows = parse_pyspy_json(data, own)
                    else:
                        rows = parse_pyspy_text(data.decode("utf-8", "replace"), own)
                except StackParseError as err:
                    notes.append(InputNote(member.display, str(err)))
                    return
                stack_rows.extend(rows)
                inputs.append(InputRecord(member.display, "stack", bytes=len(data)))
                return
        with decompressed(member) as fh:
            stats = ScanStats()
            noted = len(notes)
            rows = scan_text(fh, ctx, notes, stats)
            if stats.bytes == 0 and any(n.path == member.display for n in notes[noted:]):
                inputs.append(InputRecord(member.display, "skipped"))  # binary: the note says
                return
            if stats.bytes == 0:
                notes.append(InputNote(member.display, "empty file (0 bytes)", "info"))
            event_rows.extend(rows)
            inputs.append(InputRecord(member.display, "log", stats.lines, stats.bytes, len(rows)))
    except READ_ERRORS as err:
        notes.append(InputNote(member.display, f"cannot read: {err}", "warning"))


#: How deep bundles are looked for: ``DIR/manifest.json`` (a bundle), ``DIR/node1/`` (bundles
#: side by side), ``DIR/job42/node1/`` (several jobs' bundles).
BUNDLE_DEPTH = 2


def _split_bundles(tree: Tree, notes: list[InputNote]) -> tuple[list[tuple[Tree, Bundle]],
                                                                  list[Member]]:
    """The collect bundles in a directory or archive (each as a tree of its own files) and the
    files outside any bundle. A bundle inside another bundle's directory is part of it."""
    candidates = sorted((m for m in tree.members
                         if m.relpath.rsplit("/", 1)[-1] == layout.MANIFEST
                         and m.relpath.count("/") <= BUNDLE_DEPTH),
                        key=lambda m: (m.relpath.count("/"), m.relpath))
    found: list[tuple[str, Bundle]] = []
    for m in candidates:
        prefix = m.relpath[: -len(layout.MANIFEST)]
        if any(prefix.startswith(p) for p, _ in found):
            continue
        try:
            with m.opener() as fh:
                manifest = json.loads(fh.read(64 << 20))
        except (OSError, ValueError) as err:
            notes.append(InputNote(m.display, f"bundle manifest unreadable: {err}"))
            continue
        if not (isinstance(manifest, dict) and str(manifest.get("schema", "")).startswith(
                layout.SCHEMA_PREFIX)):
            continue
        display = m.display[: -len(layout.MANIFEST)].rstrip("/!") if prefix else tree.display
        if not manifest.get("complete", True):
            notes.append(InputNote(display, "bundle is incomplete (collect was interrupted); "
                                            "partial results used"))
        found.append((prefix, Bundle(display=display, manifest=manifest)))
    if not found:
        return [], tree.members
    if found[0][0] == "":  # the tree is one bundle
        return [(tree, found[0][1])], []
    subtrees = {p: Tree(display=b.display) for p, b in found}
    loose: list[Member] = []
    for x in tree.members:
        prefix = next((p for p, _ in found if x.relpath.startswith(p)), None)
        if prefix is None:
            loose.append(x)
            continue
        subtrees[prefix].members.append(
            Member(x.display, x.relpath[len(prefix):], x.size, x.mtime, x.opener, x.path))
    return [(subtrees[p], b) for p, b in found], loose


def _load_summaries(tree: Tree, bundle: Bundle, notes: list[InputNote],
                    inputs: list[InputRecord], frames: list[pl.DataFrame]) -> bool:
    """Events pre-parsed by collect (``summaries/events.parquet``), sources made absolute."""
    entry = bundle.manifest.get("summaries")
    if not isinstance(entry, dict) or not entry.get("events"):
        return False
    if entry.get("tool_version") != __version__ or entry.get("catalog") != catalog_hash():
        notes.append(InputNote(f"{tree.display}/{entry['events']}", "summary made by another "
                               "version of ddp-autopsy or its message catalog: raw logs read "
                               "instead", "info"))
        return False
    try:
        data = tree.read_bytes(entry["events"])
        if data is None:
            return False
        stored = pl.read_parquet(io.BytesIO(data))
        events = pl.concat([pl.DataFrame(schema=EVENT_SCHEMA), stored], how="diagonal_relaxed") \
            .select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)
    except Exception as err:  # a bad summary only costs the shortcut: raw logs are read instead
        notes.append(InputNote(f"{tree.display}/{entry['events']}",
                               f"summary unreadable, raw logs read instead: {err}", "info"))
        return False
    display = {m.relpath: m.display for m in tree.members}
    sizes = {m.relpath: m.size or 0 for m in tree.members}
    events = events.with_columns(
        pl.col("source").replace_strict(display, default=None)
        .fill_null(pl.lit(f"{tree.display}/") + pl.col("source")).alias("source"))
    frames.append(events)
    for rel, lines in (entry.get("logs") or {}).items():
        path = display.get(rel, f"{tree.display}/{rel}")
        n = events.filter(pl.col("source") == path).height
        inputs.append(InputRecord(path, "log", int(lines), sizes.get(rel, 0), n))
    return True


def _when(stamp: Any) -> datetime | None:
    """A manifest time as naive local time (the stamps in the logs are local and naive)."""
    try:
        when = datetime.fromisoformat(str(stamp))
    except ValueError:
        return None
    return when.astimezone().replace(tzinfo=None) if when.tzinfo else when


def _json_member(tree: Tree, relpath: str, notes: list[InputNote]) -> Any:
    try:
        data = tree.read_bytes(relpath)
        return json.loads(data) if data is not None else None
    except (OSError, ValueError) as err:
        notes.append(InputNote(f"{tree.display}/{relpath}", f"unreadable JSON: {err}"))
        return None


def _pointer(value: Any, default: str) -> str:
    """A manifest's pointer to a bundle file, or the layout's place for bundles without it."""
    return value if isinstance(value, str) and value else default


def _load_bundle(tree: Tree, bundle: Bundle, notes: list[InputNote], inputs: list[InputRecord],
                 event_rows: list[dict[str, Any]], stack_rows: list[dict[str, Any]],
                 env_rows: list[dict[str, Any]], proc_rows: list[dict[str, Any]],
                 dumps: list[FRDump | DumpFile]) -> None:
    man = bundle.manifest
    host = man.get("host")
    collected = _when(man.get("created"))
    inputs.append(InputRecord(f"{tree.display}/{layout.MANIFEST}", "bundle-manifest"))
    probes = _json_member(tree, _pointer(man.get("network"), layout.NETWORK_PROBES), notes)
    if isinstance(probes, list):
        bundle.probes = probes
    host_info = _json_member(tree, layout.HOST_FACTS, notes)
    if isinstance(host_info, dict):
        bundle.host_info = host_info
    for tool, rel in layout.FIREWALL.items():
        with contextlib.suppress(OSError):
            data = tree.read_bytes(rel, limit=16 << 20)
            if data:
                bundle.firewall[tool] = data.decode(errors="replace")
    by_pid: dict[int, dict[str, Any]] = {}
    for proc in layout.manifest_processes(man):
        by_pid[proc["pid"]] = proc
        proc_rows.append({
            "bundle": tree.display, "host": host, "pid": proc["pid"], "ppid": proc.get("ppid"),
            "role": proc.get("role"), "rank": proc.get("rank"),
            "local_rank": proc.get("local_rank"), "world_size": proc.get("world_size"),
            "stack_status": proc.get("stack_status"),
            "proc_state": proc.get("proc_state") if isinstance(proc.get("proc_state"), str)
            else None,
        })
        stack_rel = proc.get("stack")
        if stack_rel:
            member = tree.get(stack_rel)
            if member is None:
                notes.append(InputNote(f"{tree.display}/{stack_rel}", "stack dump listed in the "
                                       "manifest is missing"))
            else:
                owner = StackOwner(member.display, host, proc["pid"], proc.get("rank"),
                                   proc.get("local_rank"))
                _load_member(member, _context(member, host=host, ref=collected),
                             notes, inputs, event_rows, stack_rows, owner)
        info = _json_member(tree, _pointer(proc.get("info"), layout.process_info(proc["pid"])),
                            notes)
        if isinstance(info, dict):
            for key, value in (info.get("env") or {}).items():
                env_rows.append({"host": host, "pid": proc["pid"], "rank": proc.get("rank"),
                                 "key": key, "value": str(value)})
            for key, value in (info.get("versions") or {}).items():
                if value is not None:
                    env_rows.append({"host": host, "pid": proc["pid"], "rank": proc.get("rank"),
                                     "key": f"version.{key}", "value": str(value)})
    for rel in man.get("fr_dumps") or []:
        member = tree.get(rel) if isinstance(rel, str) else None
        if member is None:
            notes.append(InputNote(f"{tree.display}/{rel}", "Flight Recorder dump listed in the "
                                   "manifest is missing from the bundle"))
            continue
        _load_member(member, _context(member, host=host, ref=collected), notes, inputs,
                     event_rows, stack_rows, dumps=dumps)
    for entry in man.get("logs") or []:
        if not isinstance(entry, dict) or not entry.get("path"):
            continue
        member = tree.get(entry["path"])
        if member is None:
            notes.append(InputNote(f"{tree.display}/{entry['path']}", "log listed in the "
                                   "manifest is missing from the bundle"))
            continue
        if entry.get("truncated"):
            notes.append(InputNote(member.display, "log was truncated by collect (head and tail "
                                   "kept)", "info"))
        ctx = _context(member, host=host, ref=collected)
        proc = by_pid.get(entry.get("pid")) if isinstance(entry.get("pid"), int) else None
        if proc is not None and proc.get("rank") is not None:
            ctx.rank, ctx.local_rank = proc["rank"], proc.get("local_rank")
            ctx.cue = proc.get("rank_cue", "bundle manifest")
        _load_member(member, ctx, notes, inputs, event_rows, stack_rows)


RANKS_SCHEMA: Mapping[str, Any] = DeferredSchema(lambda: {
    "rank": pl.Int64, "hosts": pl.List(pl.String), "local_rank": pl.Int64,
    "pids": pl.List(pl.Int64), "events": pl.UInt32, "has_stack": pl.Boolean,
})


def _ranks_frame(job: Job) -> pl.DataFrame:
    parts = []
    cols = ["rank", "host", "local_rank", "pid"]
    for df in (job.events, job.stacks, job.processes):
        if df.height:
            parts.append(df.select(cols).with_columns(
                pl.lit(df is job.stacks).alias("is_stack"),
                pl.lit(df is job.events).alias("is_event"),
            ))
    if not parts:
        return pl.DataFrame(schema=RANKS_SCHEMA)
    allrows = pl.concat(parts).filter(pl.col("rank").is_not_null())
    return (
        allrows.group_by("rank")
        .agg(
            pl.col("host").drop_nulls().unique().sort().alias("hosts"),
            pl.col("local_rank").drop_nulls().first().alias("local_rank"),
            pl.col("pid").drop_nulls().unique().sort().alias("pids"),
            pl.col("is_event").sum().cast(pl.UInt32).alias("events"),
            pl.col("is_stack").any().alias("has_stack"),
        )
        .sort("rank")
    )
