"""Who wrote each event: ranks filled in from what other lines of the same writer say.

A line often names less than its neighbours: ``[default1]:NCCL WARN ...`` gives a local rank,
``gpu3:811:902 [1] NCCL WARN ...`` a host and pid, ``  3: RuntimeError`` an srun task. Other lines
of the same writer may name the global rank (``[rank5]:``, ``[PG 0 Rank 5]``, NCCL's
communicator init, torchelastic's failure summary). :func:`resolve` fills a missing rank only
from such a mapping, and only when it is unambiguous; the ``cue`` column says which mapping:

1. per file, srun ``--label`` task ids and custom launcher numbers (``[N]:``) are ranks when the
   lines that name their rank directly agree with them on at least two writers (or the only
   one), disagree nowhere, and no torchrun runs inside the tasks (no ``[default0]:`` prefixes);
2. NCCL communicator init (``comm 0x.. rank R nranks N ... Init COMPLETE``) gives the world rank
   R of that process when N is the largest communicator of the job; failing that, its channel
   set-up lines (``2[2] -> 3[3] via P2P/IPC``: the sender's) do, when the inputs show one
   communicator size at most;
3. within a file, a writer (its prefixes, and its pid when known) maps to the one rank its
   ranked lines name; across files, (host, pid) does (NCCL ``host:pid:tid`` prefixes,
   NCCL_DEBUG_FILE names, torchelastic failure summaries, collect bundles);
4. per file, one agent's torchelastic failure summary pairs local ranks with ranks
   (``rank : 2 (local_rank: 0)``): that file's ``[default0]:`` lines are rank 2's, when the
   summary names one host and no ranked line of the file pairs a local rank otherwise;
5. per file, torchrun numbers one agent's workers contiguously (rank = the node's first rank +
   local rank): when every line of the file that names both pairs them with one offset
   (``[default0]:[rank6]:`` → 6), a local rank none of them names is offset + local rank
   (``[default1]:`` → 7), unless another writer of the inputs already holds that rank;
6. when the inputs show one node only (one host at most, and no line pairs a rank with a
   different local rank), a local rank is the rank: ``[default3]:`` prefixes, torchelastic's
   ``failed (exitcode: -9) local_rank: 3``, DeepSpeed's ``'--local_rank=3' ... exits``.

Unknown stays unknown: a writer whose lines name two ranks is left alone.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job

#: Cues under which a row's rank is its writer's own (not about another process).
WRITER_CUES = (
    "torch [rankN]: prefix", "launcher prefix rank", "mpirun [job,rank] prefix",
    "message [Rank N]", "Lightning [rank: N] prefix", "Lightning GLOBAL_RANK line",
    "[RANK N] prefix", "worker prefix rank=N", "file name", "bundle manifest",
    "(rank/world) logger prefix", "Determined [rank=N] prefix", "the line opens with its rank",
)
SELF_RANK_CUE = WRITER_CUES[-1]
#: An srun --label task id in an event's stream ("t=22", lines.parse_line's).
STREAM_TASK = r"(?:^|\|)t=(\d+)"
TASK_CUE = "srun --label task id (confirmed by ranked lines)"
SLOT_CUE = "launcher prefix [N]: (confirmed by ranked lines)"
NCCL_CUE = "NCCL comm init (world communicator)"
CHANNEL_CUE = "NCCL channel set-up of the process"
STREAM_CUE = "launcher prefix mapped via [rankN] lines"
PID_CUE = "same process (pid) as ranked lines"
SUMMARY_CUE = "torchelastic failure summary"
ONE_NODE_CUE = "local rank on the only node the inputs show"
SUMMARY_LOCAL_CUE = "local rank named by the file's torchelastic failure summary"
CONTIGUOUS_CUE = "local rank + the file's node offset (torchrun numbers a node contiguously)"
#: Rows whose host, pid and rank describe one process, though another one wrote the line.
PROCESS_CUES = (*WRITER_CUES, SUMMARY_CUE, TASK_CUE, SLOT_CUE, NCCL_CUE, CHANNEL_CUE)

_TMP = ("_task", "_slot", "_host", "_launcher")


def resolve(events: pl.DataFrame, processes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Fill ``rank`` (and ``cue``) of events from the writer mappings above.

    ``processes`` (collect bundles: host, pid, rank) adds (host, pid) → rank pairs.
    """
    if events.height == 0:
        return events
    df = events.with_columns(
        pl.col("stream").str.extract(STREAM_TASK).cast(pl.Int64).alias("_task"),
        pl.col("stream").str.extract(r"(?:^|\|)s=(\d+)").cast(pl.Int64).alias("_slot"),
        pl.col("stream").str.contains(r"(?:^|\|)l=\d").fill_null(False).alias("_launcher"),
        pl.col("host").str.extract(r"^([^.]+)").alias("_host"),
    )
    df = _confirmed(df, "_task", TASK_CUE, inside_launcher_ok=False)
    df = _confirmed(df, "_slot", SLOT_CUE, inside_launcher_ok=True)
    df = _nccl_world(df)
    writer = pl.col("cue").is_in(
        [*WRITER_CUES, TASK_CUE, SLOT_CUE, NCCL_CUE, STREAM_CUE, PID_CUE])
    df = _fill(df, ["source", "stream", "pid"], writer, STREAM_CUE)
    df = _fill(df, ["source", "stream"], writer, STREAM_CUE)
    df = _fill(df, ["source", "pid"], writer, PID_CUE)
    extra = None
    if processes is not None and processes.height:
        extra = processes.select(
            pl.col("host").str.extract(r"^([^.]+)").alias("_host"), "pid", "rank"
        ).filter(pl.col("rank").is_not_null())
    df = _fill(df, ["_host", "pid"], pl.col("cue").is_in([*PROCESS_CUES, PID_CUE]), PID_CUE,
               extra)
    return _one_node(_contiguous(_summary_locals(_nccl_channels(df))), processes).drop(_TMP)


def _fill(df: pl.DataFrame, keys: list[str], known: pl.Expr, cue: str,
          extra: pl.DataFrame | None = None) -> pl.DataFrame:
    """Rows with no rank take the one rank that the ``known`` rows sharing ``keys`` agree on."""
    have = pl.all_horizontal(pl.col(k).is_not_null() for k in keys)
    pairs = df.filter(known & have & pl.col("rank").is_not_null()).select(*keys, "rank")
    if extra is not None:
        pairs = pl.concat([pairs, extra.select(*keys, "rank")], how="vertical_relaxed")
    mapping = (
        pairs.group_by(keys).agg(pl.col("rank").unique().alias("_ranks"))
        .filter(pl.col("_ranks").list.len() == 1)
        .select(*keys, pl.col("_ranks").list.first().alias("_mapped"))
    )
    if mapping.height == 0:
        return df
    df = df.join(mapping, on=keys, how="left", maintain_order="left")
    fill = pl.col("rank").is_null() & pl.col("_mapped").is_not_null()
    return df.with_columns(
        pl.when(fill).then(pl.lit(cue)).otherwise(pl.col("cue")).alias("cue"),
        pl.coalesce("rank", "_mapped").alias("rank"),
    ).drop("_mapped")


def _confirmed(df: pl.DataFrame, col: str, cue: str, *, inside_launcher_ok: bool) -> pl.DataFrame:
    """Per file: ``col`` (a task or launcher number) is the rank if ranked lines confirm it."""
    direct = pl.col("cue").is_in(WRITER_CUES) & pl.col(col).is_not_null()
    per_file = (
        df.group_by("source").agg(
            pl.col(col).drop_nulls().n_unique().alias("_n"),
            pl.col(col).filter(direct).drop_nulls().n_unique().alias("_ok"),
            (pl.col(col) != pl.col("rank")).filter(direct).any().alias("_bad"),
            pl.col("_launcher").any().alias("_inner"),
        )
        .filter(
            (pl.col("_ok") >= pl.min_horizontal(pl.col("_n"), pl.lit(2)))
            & (pl.col("_ok") > 0) & ~pl.col("_bad").fill_null(False)
            & (pl.lit(inside_launcher_ok) | ~pl.col("_inner"))
        )
        .select("source")
    )
    if per_file.height == 0:
        return df
    fill = (pl.col("source").is_in(per_file["source"].implode()) & pl.col("rank").is_null()
            & pl.col(col).is_not_null())
    return df.with_columns(
        pl.when(fill).then(pl.lit(cue)).otherwise(pl.col("cue")).alias("cue"),
        pl.when(fill).then(pl.col(col)).otherwise(pl.col("rank")).alias("rank"),
    )


def _nccl_world(df: pl.DataFrame) -> pl.DataFrame:
    """NCCL init lines of the largest communicator name their process's world rank."""
    init = pl.col("kind") == "nccl_comm_init"
    nranks = pl.col("data").str.json_path_match("$.nranks").cast(pl.Int64, strict=False)
    comm_rank = pl.col("data").str.json_path_match("$.comm_rank").cast(pl.Int64, strict=False)
    world = df.filter(init).select(nranks.max()).item()
    if world is None:
        return df
    fill = init & pl.col("rank").is_null() & (nranks == world) & comm_rank.is_not_null()
    return df.with_columns(
        pl.when(fill).then(pl.lit(NCCL_CUE)).otherwise(pl.col("cue")).alias("cue"),
        pl.when(fill).then(comm_rank).otherwise(pl.col("rank")).alias("rank"),
    )


def _nccl_channels(df: pl.DataFrame) -> pl.DataFrame:
    """A process that nothing else ranks takes the one rank its NCCL channel set-up lines give
    it (the sender of "2[2] -> 3[3] via P2P", the receiver of "[receive] via NET"), when the
    inputs show one communicator size at most and no line of the process numbers a rank below
    its device (a sub-communicator's ranks are not the job's: :func:`_channel_self`)."""
    channel = (pl.col("kind") == "nccl_channel") & pl.col("pid").is_not_null()
    if df.select(channel.any()).item() is not True:
        return df
    sizes = (df.filter(pl.col("kind") == "nccl_comm_init")
             .select(pl.col("data").str.json_path_match("$.nranks").n_unique()).item())
    if sizes > 1:
        return df
    keys = ["_host", "pid"]
    ranked = df.filter(pl.col("rank").is_not_null() & pl.col("pid").is_not_null()).select(keys)
    pairs = [(row["_host"], row["pid"], _channel_self(json.loads(row["data"] or "{}")))
             for row in df.filter(channel).select(*keys, "data").iter_rows(named=True)]
    mapping = (pl.DataFrame(pairs, schema={"_host": pl.String, "pid": pl.Int64, "_me": pl.Int64},
                            orient="row")
               .join(ranked, on=keys, how="anti", nulls_equal=True)
               .group_by(keys).agg(pl.col("_me").unique())
               # (one rank per process, none of its lines out of the world's shape)
               .filter((pl.col("_me").list.len() == 1) & pl.col("_me").list.first().is_not_null())
               .select(*keys, pl.col("_me").list.first().alias("_mapped")))
    if mapping.height == 0:
        return df
    df = df.join(mapping, on=keys, how="left", maintain_order="left", nulls_equal=True)
    fill = pl.col("rank").is_null() & pl.col("_mapped").is_not_null()
    return df.with_columns(
        pl.when(fill).then(pl.lit(CHANNEL_CUE)).otherwise(pl.col("cue")).alias("cue"),
        pl.coalesce("rank", "_mapped").alias("rank"),
    ).drop("_mapped")


def _channel_self(d: dict) -> int | None:
    """The printing process's rank of a channel line (the receiver's of "[receive]", else the
    sender's), or None when a rank of the line is below its own device index: ranks fill a node
    from device 0 up, so that is a smaller communicator's numbering (a tensor- or pipeline-
    parallel group's), not the job's. (A bus id, NCCL 2.5-2.8's, says nothing of it.)"""
    ends = [(d.get("a"), d.get("adev")), (d.get("b"), d.get("bdev"))]
    for rank, dev in ends:
        if rank is None:
            return None
        if dev is not None and str(dev).isdigit() and int(dev) < MAX_DEVICE and rank < int(dev):
            return None
    return ends[1][0] if d.get("dir") == "receive" else ends[0][0]


#: Device indices above this in a channel line's brackets are bus ids (NCCL 2.5-2.8).
MAX_DEVICE = 64


def _one_node(df: pl.DataFrame, processes: pl.DataFrame | None) -> pl.DataFrame:
    """Ranks from local ranks, when nothing in the inputs shows a second node."""
    local = pl.coalesce(
        pl.col("local_rank"),
        pl.col("data").str.json_path_match("$.local_rank").cast(pl.Int64, strict=False))
    df = df.with_columns(local.alias("_local"))
    if df.select(pl.col("_local").is_not_null().any()).item() is not True:
        return df.drop("_local")
    hosts = set(df["_host"].drop_nulls().unique().to_list())
    if processes is not None and processes.height:
        hosts |= set(processes["host"].drop_nulls().str.extract(r"^([^.]+)").to_list())
    paired = df.filter(pl.col("rank").is_not_null() & pl.col("_local").is_not_null()
                       & (pl.col("rank") != pl.col("_local")))
    if len(hosts) > 1 or paired.height or declared_nodes(df) > 1:
        return df.drop("_local")
    fill = pl.col("rank").is_null() & pl.col("_local").is_not_null()
    return df.with_columns(
        pl.when(fill).then(pl.lit(ONE_NODE_CUE)).otherwise(pl.col("cue")).alias("cue"),
        pl.coalesce("rank", "_local").alias("rank"),
    ).drop("_local")


def _summary_locals(df: pl.DataFrame) -> pl.DataFrame:
    """Per file: local ranks to the ranks its one agent's failure summary pairs them with."""
    summary = df.filter((pl.col("kind") == "elastic_failure") & pl.col("rank").is_not_null())
    if summary.height == 0:
        return df
    summary = summary.with_columns(pl.col("data").str.json_path_match("$.local_rank")
                                   .cast(pl.Int64, strict=False).alias("local_rank"))
    one_host = (summary.group_by("source").agg(pl.col("_host").drop_nulls().n_unique()
                                                .alias("_n"))
                .filter(pl.col("_n") <= 1).select("source"))
    mapping = (summary.join(one_host, on="source").filter(pl.col("local_rank").is_not_null())
               .group_by("source", "local_rank").agg(pl.col("rank").unique().alias("_ranks"))
               .filter(pl.col("_ranks").list.len() == 1)
               .select("source", "local_rank", pl.col("_ranks").list.first().alias("_mapped")))
    if mapping.height == 0:
        return df
    df = df.join(mapping, on=["source", "local_rank"], how="left", maintain_order="left")
    # A file whose ranked lines pair a local rank with another rank holds more than one node.
    clash = df.filter(pl.col("rank").is_not_null() & pl.col("_mapped").is_not_null()
                      & (pl.col("rank") != pl.col("_mapped")))["source"].unique()
    fill = (pl.col("rank").is_null() & pl.col("_mapped").is_not_null()
            & ~pl.col("source").is_in(clash.implode()))
    return df.with_columns(
        pl.when(fill).then(pl.lit(SUMMARY_LOCAL_CUE)).otherwise(pl.col("cue")).alias("cue"),
        pl.when(fill).then(pl.col("_mapped")).otherwise(pl.col("rank")).alias("rank"),
    ).drop("_mapped")


def _contiguous(df: pl.DataFrame) -> pl.DataFrame:
    """Per file: a local rank no line names takes the offset every named pair of the file
    agrees on (torchrun's rank = node's first rank + local rank)."""
    named = df.filter(pl.col("rank").is_not_null() & pl.col("local_rank").is_not_null())
    if named.height == 0 or df.filter(pl.col("rank").is_null()
                                      & pl.col("local_rank").is_not_null()).height == 0:
        return df
    per_file = (named.group_by("source").agg(
        (pl.col("rank") - pl.col("local_rank")).unique().alias("_offsets"),
        pl.struct("local_rank", "rank").unique().alias("_pairs"))
        .filter(pl.col("_offsets").list.len() == 1)
        .select("source", pl.col("_offsets").list.first().alias("_offset")))
    # one local rank with two ranks in a file (two agents' output mixed): no offset there
    mixed = (named.group_by("source", "local_rank").agg(pl.col("rank").n_unique().alias("_n"))
             .filter(pl.col("_n") > 1)["source"].unique())
    per_file = per_file.filter(~pl.col("source").is_in(mixed.implode()))
    if per_file.height == 0:
        return df
    holders = named.group_by("rank").agg(pl.struct("source", "local_rank").unique()
                                         .alias("_holders"))
    df = df.join(per_file, on="source", how="left", maintain_order="left")
    guess = (pl.col("_offset") + pl.col("local_rank")).alias("_guess")
    df = df.with_columns(guess)
    taken = (df.filter(pl.col("rank").is_null() & pl.col("_guess").is_not_null())
             .select("source", "local_rank", "_guess").unique()
             .join(holders, left_on="_guess", right_on="rank", how="inner")["_guess"])
    fill = (pl.col("rank").is_null() & pl.col("_guess").is_not_null()
            & ~pl.col("_guess").is_in(taken.implode()))
    return df.with_columns(
        pl.when(fill).then(pl.lit(CONTIGUOUS_CUE)).otherwise(pl.col("cue")).alias("cue"),
        pl.when(fill).then(pl.col("_guess")).otherwise(pl.col("rank")).alias("rank"),
    ).drop("_offset", "_guess")


def one_host(job: Job) -> bool:
    """The inputs name exactly one host (a summary's ``host : localhost``, a prefix) and no
    launch asked for more nodes: the ranks share a machine, so no network links them. False
    when no host is named at all (that says nothing)."""
    hosts = job.events["host"].drop_nulls().unique() if job.events.height else []
    return len(hosts) == 1 and declared_nodes(job.events) <= 1


def declared_nodes(events: pl.DataFrame) -> int:
    """The most nodes a launch in the inputs asked for (``--nnodes=2``, torchelastic's
    ``min_nodes : 2``; a ``--node_rank`` of N means at least N + 1), else 1."""
    rows = events.filter(pl.col("kind") == "launch_nodes")
    if rows.height == 0:
        return 1
    counts = [1]
    for text in rows["data"].drop_nulls().to_list():
        d = json.loads(text)
        counts += [d[k] for k in ("n", "max") if isinstance(d.get(k), int)]
        if isinstance(d.get("node_rank"), int):
            counts.append(d["node_rank"] + 1)
    return max(counts)


#: Collectives whose output is the group's size times their input (all-gathers), or the
#: input the size times the output (reduce-scatters), as ProcessGroupNCCL's Work prints them.
GATHERS = frozenset({"ALLGATHER", "_ALLGATHER_BASE", "ALLGATHER_COALESCED",
                     "ALLGATHER_INTO_TENSOR_COALESCED"})
SCATTERS = frozenset({"REDUCE_SCATTER", "_REDUCE_SCATTER_BASE", "REDUCE_SCATTER_TENSOR_COALESCED"})


def gathered_group_size(events: pl.DataFrame) -> int | None:
    """The largest group size a timed-out all-gather or reduce-scatter shows by its sizes
    (``OpType=ALLGATHER, NumelIn=43, NumelOut=172``: 4 ranks), else None. A group's size is
    at most the world's, so this is a lower bound of the world size."""
    data = pl.col("data")
    op = data.str.json_path_match("$.op")
    nin = data.str.json_path_match("$.nin").cast(pl.Int64, strict=False)
    nout = data.str.json_path_match("$.nout").cast(pl.Int64, strict=False)
    small = pl.when(op.is_in(list(GATHERS))).then(nin).when(op.is_in(list(SCATTERS))).then(nout)
    big = pl.when(op.is_in(list(GATHERS))).then(nout).when(op.is_in(list(SCATTERS))).then(nin)
    size = (events.lazy().filter(pl.col("kind") == "watchdog_timeout")
            .select(small.alias("small"), big.alias("big"))
            .filter((pl.col("small") > 0) & (pl.col("big") % pl.col("small") == 0))
            .select((pl.col("big") // pl.col("small")).max()).collect().item())
    return int(size) if size is not None and size >= 2 else None
