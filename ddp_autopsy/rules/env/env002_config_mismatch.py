"""Ranks disagree on the job's configuration.

## What it detects
Worker processes whose WORLD_SIZE, MASTER_ADDR, MASTER_PORT or TORCHELASTIC_RUN_ID differ (from
`collect`'s environment snapshots), several processes claiming the same global rank, and a
framework's view of the job that contradicts the launcher's: e.g. Lightning's "initializing
ddp: GLOBAL_RANK: 1, MEMBER: 2/4" printed twice for rank 1 while ranks 2 and 3 never appear
(two nodes both started as ranks 0-1 of a 4-rank job). NCCL's bootstrap root says the same
when ranks build a communicator of different sizes: "Bootstrap Root : mismatch in rank count
from procs 4 : 8" (≤2.22), "mismatch in info from procs, nranks 4 vs 8" (2.23+), and NCCL's
init refuses a rank outside the communicator: "Invalid rank requested : 2/2". Also a process
that asked for a GPU it cannot see ("CUDA error: invalid device ordinal"): more processes per
node than visible GPUs, or a device index taken from the global rank (likewise a framework's own
check: Lightning's "You requested GPUs: [0, 1] But your machine only has: [0]"); a checkpoint
sharded for
another number of model-parallel ranks than the job has (the LLaMA loader's "Loading a checkpoint
for MP=2 but world size is 1", copied into its many forks), and a framework's own check that the
world fits its parallel layout (Megatron-Core's "world_size (8) is not divisible by ...",
TensorRT-LLM's "mpiSize == tp * pp", vLLM's "required GPUs exceeds the total number of available
GPUs in the placement group"). And from Gloo's init
alone: the ranks of one node time out in init_process_group waiting for the store key of a rank
the job does not have (`keys: /default_pg/0//cpu//0/4` when the launchers started ranks 0-3),
while the other ranks got past init, or, running on the other nodes, printed no such timeout. And
torchelastic's "config has no run_id, generated a random run_id" (an empty --rdzv-id) where the
launcher's own rendezvous then failed: each node made up its own id.

## Why it hangs or kills the job
Ranks that disagree on the world size or the master wait for peers that will never come (or
join another job's store); two processes with the same rank collide in the store and the
missing rank's peers wait forever.

## Evidence
The values each rank holds, or the duplicated rank announcements.

## Remedy
Launch every node with the same `--nnodes`, `--nproc-per-node`, `--master-addr`/`--rdzv-endpoint`
and run id; under SLURM set `--ntasks-per-node` to the GPUs per node (Lightning reads
SLURM_NTASKS / SLURM_PROCID), and don't set RANK/WORLD_SIZE by hand under torchrun.

## Example
```
initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/4
initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/4
initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/4
initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/4
```
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import timedelta

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.rules.base import (
    Evidence,
    Finding,
    Rule,
    evidence_of,
    excerpt,
    rank_phrase,
    ranks_of,
)

KEYS = ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
#: torch.distributed calls a rank past init_process_group can be blocked in.
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "reduce", "gather", "scatter", "barrier",
    "all_to_all", "all_to_all_single", "send", "recv", "all_gather_object",
    "broadcast_object_list", "monitored_barrier", "wait"})


#: Where a parallel-layout check's own words start on its line (after prefixes and the
#: exception's type).
LAYOUT_WORDS = re.compile(r"(?:decoder )?world_size \(|Assertion failed: mpiSize|The number of "
                          r"required GPUs|please set tensor_parallel_size|Total available GPUs")


class ConfigMismatch(Rule):
    code = "ENV002"
    slug = "config-mismatch"
    cause = "config_mismatch"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        yield from self._env(job)
        yield from self._announcements(job)
        yield from self._nccl_bootstrap(job)
        yield from self._nccl_invalid_rank(job)
        yield from self._init_waits_beyond(job)
        yield from self._device_ordinal(job)
        yield from self._gpus_requested(job)
        yield from self._checkpoint_world(job)
        yield from self._parallel_layout(job)
        yield from self._random_run_id(job)

    def _random_run_id(self, job: Job) -> Iterator[Finding]:
        """torchelastic generated a random rendezvous id ("config has no run_id, generated a
        random run_id: ..."; an empty --rdzv-id, most often a job-id variable that was unset)
        and the launcher's own rendezvous failed: every node made up its own id, so the nodes
        wait in different rendezvous and never meet."""
        rows = job.rows("random_run_id")
        # (workers that ran and failed met in their rendezvous: the launcher's exception after
        # them, ChildFailedError, is their failure's report)
        if not rows or job.rows("worker_failed", "elastic_failure", "spawn_failed"):
            return
        failed = [r for r in job.rows("rdzv_connection_error")
                  if "Timeout" in str(r["data"].get("error"))] + [
            r for r in job.rows("exception", "traceback_fragment")
            if LAUNCHER_FRAMES.search(str((r["data"].get("frame") or {}).get("file", "")))
            and "ChildFailedError" not in str(r["data"].get("type", ""))]
        if not failed:
            return
        yield self.from_rows(
            [*rows[:1], *failed[:1]], "torchelastic generated a random rendezvous id (the "
            "launch gave an empty --rdzv-id) and the launcher's rendezvous failed: each node "
            "makes up its own id, so the nodes wait in different rendezvous and never meet. "
            "Give every node the same --rdzv-id (check that the variable it comes from, such "
            "as $SLURM_JOB_ID, is set on every node).", shown=2, ranks=(), confidence=0.7,
            details={"run_id": rows[0]["data"].get("run_id")})

    def _parallel_layout(self, job: Job) -> Iterator[Finding]:
        """A framework's own check that the job's world fits its parallel layout failed
        (Megatron's "world_size (8) is not divisible by ...", TensorRT-LLM's "mpiSize == tp *
        pp", vLLM's "required GPUs exceeds ... the placement group"): every rank raises it."""
        rows = job.rows("parallel_layout_mismatch")
        if not rows:
            return
        text = rows[0]["text"]
        start = LAYOUT_WORDS.search(text)
        quote = excerpt(text[start.start() if start else 0:], 160).rstrip(".")
        yield self.from_rows(
            rows, f"The job's parallel layout does not fit its world size: "
            f"{quote}. Launch as many processes (GPUs) as the layout "
            "needs (tensor x pipeline x expert/context parallel sizes), or shrink the layout to "
            "the GPUs the job has.", shown=2, ranks=(), confidence=0.8)

    def _checkpoint_world(self, job: Job) -> Iterator[Finding]:
        """A checkpoint sharded for N model-parallel ranks loaded by a job of another world
        size (the LLaMA loader's "Loading a checkpoint for MP=2 but world size is 1"; MP=0 is
        no checkpoint found, not a size)."""
        rows = [r for r in job.rows("checkpoint_world_mismatch") if r["data"]["mp"] >= 1
                and str(r["data"]["ws"]) != str(r["data"]["mp"])]
        if not rows:
            return
        d = rows[0]["data"]
        started = "without a launcher's world size" if d["ws"] == "None" else \
            f"with a world size of {d['ws']}"
        yield self.from_rows(
            rows, f"The checkpoint is sharded for {d['mp']} model-parallel "
            f"rank{'s' if d['mp'] > 1 else ''}, and the job "
            f"was started {started}: launch it with --nproc_per_node {d['mp']} (one process per "
            "shard).", shown=2, confidence=0.85, details={"mp": d["mp"], "world": d["ws"]})

    def _device_ordinal(self, job: Job) -> Iterator[Finding]:
        """"CUDA error: invalid device ordinal" (a set_device / .to(device) of a GPU this
        process cannot see): more processes per node than visible GPUs (`--nproc_per_node` above
        the GPU count, a CUDA_VISIBLE_DEVICES narrower than the launch), or a device index
        computed from the global rank instead of the local one."""
        rows = _invalid_ordinal(job)
        if not rows:
            return
        ranks = sorted({r["rank"] for r in rows if r["rank"] is not None})
        who = rank_phrase(ranks) if ranks else "Some ranks"
        yield self.from_rows(
            rows, f"{who[0].upper()}{who[1:]} asked for a GPU {'it' if len(ranks) == 1 else 'they'} "
            "cannot see (CUDA error: invalid device ordinal): the launch starts more processes per "
            "node than there are visible GPUs (--nproc_per_node, CUDA_VISIBLE_DEVICES), or the "
            "device index comes from the global rank instead of LOCAL_RANK.", shown=2,
            ranks=ranks, confidence=0.8)

    def _gpus_requested(self, job: Job) -> Iterator[Finding]:
        """A framework's own check that the GPUs it was told to use are visible failed
        (Lightning's "You requested GPUs: [0, 1] But your machine only has: [0]")."""
        rows = job.rows("gpus_requested_unavailable")
        if not rows or _invalid_ordinal(job):
            return  # (CUDA's own "invalid device ordinal" says it first: _device_ordinal's)
        d = rows[0]["data"]
        if d.get("shards"):
            yield self.from_rows(
                rows, "More shards were started than the process sees GPUs (text-generation-"
                "inference: 'Each process is one gpu'): --num-shard against the GPUs given to the "
                "container (--gpus, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES).", shown=2,
                ranks=ranks_of(rows), confidence=0.8)
            return
        have = f" but sees only [{d['have']}]" if d.get("have") is not None else ""
        yield self.from_rows(
            rows, f"The training framework was told to use GPUs [{d['asked']}]{have}: the "
            "launch gives each process fewer GPUs than the Trainer asks for (SLURM's --gres / "
            "--gpus-per-task, CUDA_VISIBLE_DEVICES, a Ray worker's GPUs). Ask for devices=1 "
            "per process, or give each process the GPUs it asks for.", shown=2,
            ranks=ranks_of(rows), confidence=0.8)

    def _init_waits_beyond(self, job: Job) -> Iterator[Finding]:
        """Ranks that waited in init_process_group for the address of a rank the job does not
        have (Gloo's store key ``.../N``, N above every rank seen) while other ranks got past
        init into a collective (or read every peer's address and failed to connect Gloo's full
        mesh to the waiting ones): the waiting ranks were given a larger world size."""
        waits: dict[int, dict] = {}
        for r in job.rows("store_wait_timeout"):
            key = str(r["data"].get("keys") or "").rsplit("/", 1)
            if r["rank"] is not None and len(key) == 2 and key[1].isdigit():
                waits[r["rank"]] = r | {"awaited": int(key[1])}
        if not waits:
            return
        past: set[int] = set()
        for r in job.rows("exception"):
            func = (r["data"].get("frame") or {}).get("func") or ""
            if r["rank"] is not None and r["rank"] not in waits and func in COLLECTIVES:
                past.add(r["rank"])
        past |= {r["rank"] for r in job.rows("gloo_timeout", "watchdog_timeout")
                 if r["rank"] is not None and r["rank"] not in waits}
        # (or that had every peer's address: Gloo connects its full mesh after reading them
        # all, so a rank whose mesh then failed to connect was not waiting for one)
        meshed = {r["rank"] for r in job.rows("exception")
                  if r["rank"] is not None and r["rank"] not in set(waits) | past
                  and "connectFullMesh" in r["text"]}
        past |= meshed
        seen = set(waits) | past
        awaited = {w["awaited"] for w in waits.values()}
        if not past:
            yield from self._init_waits_alone(job, waits, awaited)
            return
        if min(awaited) <= max(seen) or (job.world_size or 0) > min(awaited):
            return  # (a rank the job does have: late, or its log not in the inputs)
        who = rank_phrase(waits)
        yield self.finding(
            f"{who[0].upper()}{who[1:]} waited in init_process_group for rank "
            f"{'/'.join(map(str, sorted(awaited)))}, which this job does not have, while "
            + (f"{rank_phrase(past)} got past init and ran collectives" if not meshed else
               f"{rank_phrase(past)} had every peer's address (their Gloo mesh then failed to "
               f"connect to {rank_phrase(waits)}, still waiting)")
            + f": {who} {'was' if len(waits) == 1 else 'were'} started with a "
            "larger WORLD_SIZE than the others (a node launched with another --nnodes or "
            "--nproc-per-node, or WORLD_SIZE set by hand)"
            + (f"; unless rank {min(awaited)} exists and started too late, its log not in the "
               "inputs" if meshed else "") + ".",
            evidence=[evidence_of(w) for w in list(waits.values())[:2]], ranks=set(waits),
            confidence=0.55 if meshed else 0.7,
            details={"awaited_rank": sorted(awaited), "got_past": sorted(past)})

    def _init_waits_alone(self, job: Job, waits: dict[int, dict],
                          awaited: set[int]) -> Iterator[Finding]:
        """The same wait with no rank past init. When a rank the job does not have is awaited
        by every started rank, they all time out alike. Here the waiting ranks are the
        processes of some hosts only: the worker processes of the other hosts (their lines
        carry a local rank) were running when the wait began and printed no timeout although
        the inputs go on past its end, and the awaited rank is not below the count of every
        worker process seen. The waiting hosts were started with a larger WORLD_SIZE (the others
        wait on them, silently, in their own init)."""
        timed = [r for r in job.rows("store_wait_timeout")
                 if r["rank"] in waits and r["ts"] is not None and r["data"].get("ms")]
        events = job.frame("events")
        waiting_hosts = {w["host"] for w in waits.values()}
        if not timed or None in waiting_hosts:
            return
        end = max(r["ts"] for r in timed)
        began = min(r["ts"] - timedelta(milliseconds=r["data"]["ms"]) for r in timed)
        workers = events.filter(pl.col("local_rank").is_not_null() & pl.col("host").is_not_null())
        started = workers.select("host", "local_rank").unique().height
        quiet = workers.filter(~pl.col("host").is_in(list(waiting_hosts)))
        failing = set(kinds_tagged("failure")) - set(kinds_tagged("terminated"))
        last_seen = quiet["ts"].drop_nulls().max()
        inputs_end = events["ts"].drop_nulls().max()
        if (not quiet.height or min(awaited) < started
                or quiet.filter(pl.col("kind").is_in(list(failing))).height
                or last_seen is None or last_seen < began - timedelta(seconds=5)
                or inputs_end is None or inputs_end <= end):
            return
        others = sorted(set(quiet["host"].to_list()))
        who = rank_phrase(waits)
        hosts = sorted(waiting_hosts)
        yield self.finding(
            f"{who[0].upper()}{who[1:]} (on {', '.join(hosts)}) waited in init_process_group "
            f"for rank {'/'.join(map(str, sorted(awaited)))}, but the launchers started "
            f"{started} worker processes (ranks 0-{started - 1}), and those on "
            f"{', '.join(others)}, running when the wait began, printed no timeout while the "
            f"logs go on past its end: {who} were started with a larger WORLD_SIZE than the "
            "others (a node launched with another --nnodes or --nproc-per-node, or WORLD_SIZE "
            "set by hand).",
            evidence=[evidence_of(w) for w in list(waits.values())[:2]], ranks=set(waits),
            hosts=hosts, confidence=0.55,
            details={"awaited_rank": sorted(awaited), "worker_processes": started,
                     "quiet_hosts": others})

    def _nccl_invalid_rank(self, job: Job) -> Iterator[Finding]:
        """NCCL init refused a rank not below the communicator's size."""
        rows = job.rows("nccl_invalid_rank")
        if not rows:
            return
        d = rows[0]["data"]
        # (the refused number is the rank that process was given: ncclCommInitRank's own)
        asked = sorted({r["data"]["asked"] for r in rows if r["data"]["asked"] >= 0})
        who = f"A process asked NCCL for rank {d['asked']}" if len(asked) <= 1 else \
            f"Processes asked NCCL for ranks {', '.join(map(str, asked))}"
        yield self.from_rows(
            rows, f"{who} of a communicator of {d['nranks']} ranks: the rank and world size the "
            f"job was given disagree (ranks run from 0 to {d['nranks'] - 1}).", shown=2,
            ranks=asked, confidence=0.8, details={"asked": d["asked"], "nranks": d["nranks"]})

    def _nccl_bootstrap(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("nccl_bootstrap_mismatch")
        if not rows:
            return
        d = rows[0]["data"]
        counts = (f" ({d['a']} vs {d['b']} ranks)" if "a" in d else
                  f" ({d['n1']} vs {d['n2']} ranks)" if "n1" in d else "")
        yield self.finding(
            f"Ranks build NCCL communicators of different sizes{counts}: NCCL's bootstrap root "
            "refused them, and every rank hangs in init.",
            evidence=[evidence_of(r) for r in rows[:2]],
            ranks={r["rank"] for r in rows if r["rank"] is not None},
            hosts=[r["host"] for r in rows], confidence=0.75,
            details={"world_sizes": [d[k] for k in ("a", "b", "n1", "n2") if k in d]},
        )

    def _env(self, job: Job) -> Iterator[Finding]:
        if not job.env.height or not job.processes.height:
            return
        workers = set(job.processes.filter(pl.col("role") == "worker")["pid"].to_list())
        env = job.env.filter(pl.col("pid").is_in(list(workers)) & pl.col("key").is_in(KEYS))
        for key in KEYS:
            rows = env.filter(pl.col("key") == key)
            values = Counter(rows["value"].to_list())
            if len(values) < 2:
                continue
            common = values.most_common(1)[0][0]
            odd = rows.filter(pl.col("value") != common)
            ranks = [r for r in odd["rank"].to_list() if r is not None]
            desc = "; ".join(f"{k}={v!r} on {n} process(es)" for v, n in values.most_common()
                             for k in [key])
            yield self.finding(
                f"Ranks disagree on {key}: {desc}.",
                evidence=[Evidence(path=f"{r['host']} pid {r['pid']} (collect)", line=None,
                                   text=f"{key}={r['value']}", rank=r["rank"], host=r["host"])
                          for r in odd.head(3).iter_rows(named=True)],
                ranks=ranks, hosts=odd["host"].to_list(), confidence=0.85,
                details={"key": key, "values": dict(values)},
            )
        ranked = job.processes.filter((pl.col("role") == "worker") & pl.col("rank").is_not_null())
        dup = ranked.group_by("rank").agg(pl.len().alias("n"), pl.col("host"), pl.col("pid")) \
            .filter(pl.col("n") > 1)
        for row in dup.iter_rows(named=True):
            yield self.finding(
                f"{row['n']} processes claim rank {row['rank']} (pids {row['pid']}).",
                ranks=[row["rank"]], hosts=row["host"], confidence=0.85,
                evidence=[Evidence(path=f"{h} pid {p} (collect)", line=None,
                                   text=f"RANK={row['rank']}", rank=row["rank"], host=h)
                          for h, p in zip(row["host"][:3], row["pid"][:3], strict=False)],
            )

    def _announcements(self, job: Job) -> Iterator[Finding]:
        starts = [r for r in job.rows("run_start") if "world" in r["data"]]
        if not starts:
            return
        by_rank: dict[int, list[dict]] = defaultdict(list)
        for r in starts:
            by_rank[r["data"]["rank"]].append(r)
        world = max(r["data"]["world"] for r in starts)
        # Each process announces once per start; a rank announced by more processes than any
        # other while other ranks are absent means several processes took the same rank.
        missing = sorted(set(range(world)) - set(by_rank))
        if not missing:
            return
        dups = [rank for rank, rows in by_rank.items() if len(rows) > 1]
        if not dups:
            return
        yield self.finding(
            f"{rank_phrase(dups).capitalize()} started more than once while "
            f"{rank_phrase(missing)} of the {world} never started: processes were given the "
            "same rank (e.g. every node started as ranks 0-1).",
            evidence=[evidence_of(r) for rows in by_rank.values() for r in rows][:4],
            ranks=missing, confidence=0.8,
            details={"duplicated": dups, "missing": missing, "world_size": world},
        )


#: The launcher's own frames: torchelastic's launch_agent and its rendezvous (not a worker's).
LAUNCHER_FRAMES = re.compile(r"torch/distributed/(?:launcher/api|elastic/(?:agent|rendezvous)/)")


def _invalid_ordinal(job: Job) -> list[dict]:
    """CUDA's "invalid device ordinal", as torch, NCCL or nccl-tests report it."""
    # (nccl-tests' CUDACHECK says it too: "node1: Test CUDA failure common.cu:963 'invalid
    # device ordinal'")
    return [r for r in job.rows("cuda_failure", "exception", "nccl_error")
            if "invalid device ordinal" in r["text"]]
