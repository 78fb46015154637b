"""A rank ran out of GPU or host memory.

## What it detects
`torch.OutOfMemoryError: CUDA out of memory`, NCCL's "Cuda failure 'out of memory'", or the
kernel's OOM killer ("Out of memory: Killed process PID") for a training process. Without such a
line, a worker killed by SIGKILL (exit code -9, torchelastic's "Signal 9 (SIGKILL) received",
mp.spawn's "terminated with signal SIGKILL", mpirun's or PALS's "rank 12 died from signal 9", srun's
"tasks 4-7: Killed", which names ranks when srun started them) that left no traceback and was not
stopped by its
launcher or scheduler first is reported as the likely work of the host's OOM killer, with a lower
confidence; so, lower still, is a Ray actor whose process died with no error of its own ("Worker
exit type: SYSTEM_ERROR"), which Ray itself puts down to the OOM killer first; and, lowest, a
launcher's teardown of its workers glued to a checkpoint-loading progress bar ("Loading
checkpoint shards: 47%|... Sending process N closing signal SIGTERM") with no worker's error.
NCCL's own failed device allocation ("Failed to CUDA calloc async 1920 bytes", include/alloc.h;
torch quotes it as an ncclInternalError's "Last error:") is read as GPU memory running out unless
another CUDA error came with it (after an illegal access every allocation fails).

## Why it hangs or kills the job
The rank that runs out of memory dies (or is killed without a traceback); the others block in
their next collective until the timeout, then fail with errors that only say a peer is gone.

## Evidence
The out-of-memory line with the rank, and how much it tried to allocate; or the SIGKILL exit
(confirm with `dmesg` / `journalctl -k` on that host: "Out of memory: Killed process"). When
nothing in the inputs names a rank and one node's CUDA messages name a single GPU ("GPU 3 has a
total capacity ..."), that GPU's local rank is named, by the one-process-per-GPU convention
(the summary says so).

## Remedy
Lower the memory peak on that rank: smaller micro-batch, activation checkpointing, sharding
(FSDP/ZeRO), `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation; for the
host OOM killer, fewer DataLoader workers or less host-side caching. Ranks with uneven inputs
(longer sequences) need headroom for the largest batch.

## Example
```
[rank11]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB. GPU 3 has a total capacity of 63.42 GiB of which 1.70 GiB is free.
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.attribution import ONE_NODE_CUE, SUMMARY_CUE, declared_nodes
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.analyzer.ranksets import expand_ranks
from ddp_autopsy.rules.base import Finding, Rule, ranks_of, subject
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE

#: Cues under which a launcher's failure line's rank is the failed worker's.
SUBJECT_CUES = (ONE_NODE_CUE, SUMMARY_CUE)


#: The device of CUDA's out-of-memory message: "Tried to allocate 786.00 MiB (GPU 0; ...".
#: The most GPUs one node has: ranks beyond it are on another node, where a local rank or a GPU
#: index is not the rank.
NODE_GPUS = 8


def _one_node(job: Job) -> bool:
    """Whether the job looks like one node's: no launch asked for more, and every rank seen
    fits one node's GPUs (then a local rank or a GPU index is the rank)."""
    return declared_nodes(job.events) <= 1 and (
        not job.ranks.height or max(job.ranks["rank"].to_list()) < NODE_GPUS)


def _recovered(job: Job, row: dict[str, Any]) -> bool:
    """fairseq's "attempting to recover from OOM" skips the batch and trains on: an OOM of the
    job only when its process then died (a traceback or a crash after it in its file)."""
    if "attempting to recover from OOM" not in row["text"]:
        return False
    return not any(r["source"] == row["source"] and r["line"] > row["line"]
                   for r in job.rows("traceback", "traceback_fragment", "exception",
                                     "spawn_failed", "worker_failed", "native_signal"))


def _history(job: Job, row: dict[str, Any]) -> bool:
    """Kubernetes' "Last State: Terminated / Reason: OOMKilled" is the container's previous
    run: history when something else failed in this one."""
    if "OOMKilled" not in row["text"] or not any(
            r["source"] == row["source"] and 0 < row["line"] - r["line"] <= 3
            for r in job.rows("k8s_last_state")):
        return False
    return any(r["kind"] != "oom" for r in job.rows(*kinds_tagged("failure")))


TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]i?B)")
GPU_INDEX = re.compile(r"\(GPU (\d+);|GPU (\d+) has a total capac(?:i)?ty")  # (2.1's typo)


class OutOfMemory(Rule):
    code = "CRASH002"
    slug = "out-of-memory"
    cause = "out_of_memory"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = [r for r in job.rows("oom") if not _recovered(job, r) and not _history(job, r)]
        if any("nbytes" in r["data"] for r in rows) and any(
                "out of memory" not in r["text"] for r in job.rows("cuda_failure")):
            # (NCCL's "Failed to CUDA calloc" says only that an allocation failed: after
            # another CUDA error, an illegal access, every later call fails so)
            rows = [r for r in rows if "nbytes" not in r["data"]]
        if not rows:
            killed = list(self._killed(job)) or list(self._ray_worker_died(job))
            yield from killed or self._teardown_while_loading(job)
            return
        ranks = ranks_of(rows) or {int(r["data"]["victim"]) for r in rows
                                   if r["data"].get("victim") is not None} \
            or self._proxy_rank(job, rows) or self._failed_worker(job) \
            or self._killed_pid_rank(job, rows) \
            or self._srun_tasks(job, rows)
        by_gpu = False
        if not ranks and _one_node(job):
            # nothing names a rank: one process per GPU on one node makes "GPU N" local rank N
            # (with other ranks seen, only N > 0: a process that sees one GPU calls it GPU 0)
            gpus = {int(m[1] or m[2]) for r in rows if (m := GPU_INDEX.search(r["text"]))}
            if len(gpus) == 1 and (not job.ranks.height or min(gpus) > 0) \
                    and len({h for r in rows if (h := r["host"])}) <= 1:
                ranks, by_gpu = gpus, True
        # (the match may start at "torch.cuda.OutOfMemoryError", before the size it names)
        tried = next((r["data"].get("tried") or m.group(1) for r in rows
                      if r["data"].get("tried") or (m := TRIED.search(r["text"]))), None)
        kind = "host memory (OOM killer)" if any(
            r["data"].get(k) for r in rows for k in ("host", "cgroup", "node")) \
            else "host memory" if any(r["data"].get(k) for r in rows
                                      for k in ("cpu", "ray", "replica")) \
            else "GPU memory" if any("CUDA" in r["text"] or r["data"].get("cuda")
                                     for r in rows) else "memory"
        who = subject(ranks, "A rank")
        if by_gpu:
            who += f" (its GPU {next(iter(ranks))}, one process per GPU)"
        summary = f"{who} ran out of {kind}"
        summary += f" (tried to allocate {tried})." if tried else "."
        yield self.from_rows(rows, summary, shown=2, ranks=ranks, confidence=0.9,
                             details={"tried": tried, "kind": kind})

    def _teardown_while_loading(self, job: Job) -> Iterator[Finding]:
        """The launcher tore its workers down (torchelastic's "Sending process N closing signal
        SIGTERM", DeepSpeed's "Killing subprocess N") while the ranks were loading the model's
        checkpoint (the progress bar the teardown line is glued to), and no worker said why:
        every rank holding the whole checkpoint in host memory at once is how a load most
        often dies, by the OOM killer, without a word."""
        rows = [r for r in job.rows("closing_signal")
                if LOADING_BAR.search(str(r["data"].get("after_bar", "")))]
        if not rows or job.rows(*kinds_tagged("failure"), "agent_signal", "external_signal"):
            return
        bar = " ".join(str(rows[0]["data"]["after_bar"]).split("|")[0].strip("`' ").split())[:80]
        yield self.from_rows(
            rows, "A worker died while the ranks were loading the checkpoint (the launcher then "
            f"stopped the others, its teardown glued to `{bar}`) and left no error of its own: "
            "most likely the host's OOM killer, every rank holding the whole checkpoint in host "
            "memory at once.", shown=1, ranks=(), confidence=0.4,
            details={"kind": "host memory (OOM killer)", "while": "loading the checkpoint"})

    @staticmethod
    def _proxy_rank(job: Job, rows: list[dict[str, Any]]) -> set[int]:
        """An NCCL out-of-memory line's rank, from the same process's proxy ("[Proxy Service
        93] Failed to execute operation Setup from rank 93": the service is rank 93's own)."""
        writers = {(r["host"], r["pid"]) for r in rows if r["pid"] is not None}
        return {int(r["data"]["svc"]) for r in job.rows("nccl_connect_failure")
                if r["data"].get("svc") is not None and (r["host"], r["pid"]) in writers}

    @staticmethod
    def _failed_worker(job: Job) -> list[int]:
        """An unranked out-of-memory line's rank: the only worker the launcher saw fail."""
        failed = {r["rank"] for r in job.rows("worker_failed", "elastic_failure")
                  if r["cue"] in SUBJECT_CUES and r["rank"] is not None
                  and r["data"].get("exitcode") not in (None, 0)}
        return sorted(failed) if len(failed) == 1 else []

    @staticmethod
    def _killed_pid_rank(job: Job, rows: list[dict[str, Any]]) -> set[int]:
        """The kernel's "Killed process P" mapped to a rank by the launcher's own pid table:
        torchelastic's "local_rank: N (pid: P)" and its failure summary, or DeepSpeed's launcher,
        which starts its local ranks in order and kills them in that order ("Killing subprocess
        P", one line each): the n-th pid is local rank n (a one-node job's rank)."""
        pids = {int(p) for r in rows if str(p := r["data"].get("pid") or "").isdigit()}
        if not pids:
            return set()
        table: dict[int, int] = {}
        one_node = _one_node(job)
        for r in job.rows("worker_failed", "elastic_failure"):
            d = r["data"]
            # (a local rank is the rank only on one node)
            rank = d.get("rank", r["rank"]) if r["kind"] == "elastic_failure" else (
                d.get("local_rank") if one_node else None)
            if isinstance(d.get("pid"), int) and isinstance(rank, int):
                table[d["pid"]] = rank
        if not table and one_node:
            killing = [r["data"]["pid"] for r in job.rows("closing_signal")
                       if "Killing subprocess" in r["text"] and isinstance(r["data"].get("pid"),
                                                                          int)]
            table = {pid: n for n, pid in enumerate(dict.fromkeys(killing))}
        return {table[p] for p in pids if p in table}

    @staticmethod
    def _srun_tasks(job: Job, rows: list[dict[str, Any]]) -> set[int]:
        """srun's "srun: error: gpu20-15: task 0: Out Of Memory" (or "tasks 4-7: Killed")
        names tasks: the ranks (SLURM_PROCID) when srun started the ranks itself, a node's
        launcher when it started torchrun or another agent (whose lines then are in the inputs,
        and say nothing here)."""
        if job.rows("worker_failed", "elastic_failure", "closing_signal", "agent_signal",
                    "launch_nodes", "spawn_failed"):
            return set()
        return set().union(*(expand_ranks(r["data"].get("tasks")) for r in rows))

    def _ray_worker_died(self, job: Job) -> Iterator[Finding]:
        """A Ray actor's process that exited without Ray asking (SYSTEM_ERROR) and with no
        error of its own: the kernel's OOM killer is the usual reason, as Ray itself says."""
        died = [r for r in job.rows("ray_worker_died") if r["data"].get("exit_type") ==
                "SYSTEM_ERROR" or r["data"].get("unexpected")]
        if not died or job.rows("agent_signal", "external_signal", "network_error"):
            return  # stopped from outside, or its NIC failed first: not the OOM killer's doing
        # Ray Train names the training worker whose actor died (its index is its world rank)
        failed = job.rows("ray_train_worker_failed")
        ranks = sorted({r["data"]["rank"] for r in failed})
        who = f"Ray Train worker {ranks[0]}'s process" if len(ranks) == 1 else \
            "A Ray worker process"
        yield self.from_rows(
            died + failed, f"{who} died with no error of its own (exit type SYSTEM_ERROR, "
            f"{(died[0]['data'].get('detail') or 'connection lost').strip()}): most likely the "
            "host's OOM killer (`dmesg` on that host confirms it; a segfault is the other "
            "common reason).", shown=2, confidence=0.45, ranks=ranks if len(ranks) == 1 else [],
            details={"kind": "host memory (worker vanished)"})

    def _killed(self, job: Job) -> Iterator[Finding]:
        """SIGKILL with no traceback and no outside stop: the host's OOM killer, most likely."""
        if job.rows("agent_signal", "external_signal") or any(
                r["data"].get("signal") in ("SIGHUP", "SIGINT") for r in job.rows("closing_signal")):
            return  # stopped from outside (CRASH003): a SIGKILL may be the scheduler's doing
        if any(r["data"].get("signal") == "SIGKILL" for r in job.rows("closing_signal")):
            return  # the launcher's own SIGKILL, after SIGTERM did not stop it: not the kernel
        killed = [r for r in job.rows("elastic_failure", "worker_failed", "spawn_failed",
                                      "native_signal", "mpi_process_exit")
                  if r["data"].get("exitcode") == -9 or r["data"].get("signal") == "SIGKILL"
                  or r["data"].get("signum") == 9
                  or "SIGKILL" in str(r["data"].get("traceback", ""))]
        # A worker its launcher sent SIGTERM first, then SIGKILL: the teardown (a frozen rank),
        # not the kernel (``Unable to shutdown process N via 15, forcefully exiting via 9``).
        killed = [r for r in killed if r["data"].get("pid") not in job.crashes.stopped_pids]
        # srun's "srun: error: nid001321: tasks 4-7: Killed" (its tasks died of SIGKILL)
        tasks = [r for r in job.rows("srun_task_failed") if r["data"].get("what") == "Killed"]
        if not killed and not tasks:
            return
        killed = [_unwrapped(r, job) for r in killed] + tasks
        ranks = {r["data"]["rank"] for r in killed if isinstance(r["data"].get("rank"), int)}
        ranks |= self._srun_tasks(job, tasks)
        ranks |= {r["rank"] for r in killed if r["cue"] == ONE_NODE_CUE}
        ranks |= {int(r["data"]["index"]) for r in killed  # mp.spawn's index is the rank
                  if r["kind"] == "spawn_failed" and str(r["data"].get("index", "")).isdigit()}
        raised = {r["rank"] for r in job.rows("exception")
                  if r["rank"] is not None and not CONSEQUENCE.search(r["text"])}
        if ranks and ranks <= raised:
            return  # it raised first: its own error is the story (CRASH001)
        local = sorted({r["data"]["local_rank"] for r in killed
                        if isinstance(r["data"].get("local_rank"), int)})
        who = subject(ranks, f"Local rank {local[0]}" if len(local) == 1 else "A worker")
        yield self.from_rows(
            killed, f"{who} {'were' if len(ranks) > 1 else 'was'} killed with SIGKILL and left no "
            "traceback: most likely the host's "
            "OOM killer (host memory exhausted; `dmesg` on that host confirms it).", shown=2,
            ranks=ranks, confidence=0.55,
            details={"kind": "host memory (SIGKILL, no traceback)", "local_ranks": local})


def _unwrapped(row: dict[str, Any], job: Job) -> dict[str, Any]:
    """DeepSpeed's "['python', '-u', 'train.py', '--local_rank=7', ...] exits with return code =
    -9" wrapped over several lines: the exit code's row takes the worker (and its rank, when
    the inputs tell it) from the line above that named it."""
    if row["kind"] != "worker_failed" or row["data"].get("local_rank") is not None:
        return row
    head = [r for r in job.rows("worker_failed")
            if r["source"] == row["source"] and row["line"] - 6 <= r["line"] < row["line"]
            and r["data"].get("exitcode") is None and r["data"].get("local_rank") is not None]
    if not head:
        return row
    h = head[-1]
    return {**row, "rank": h["rank"], "cue": h["cue"],
            "data": {**row["data"], "local_rank": h["data"]["local_rank"]}}


#: A progress bar of a model's checkpoint being loaded (transformers' "Loading checkpoint
#: shards", safetensors' and the frameworks' own).
LOADING_BAR = re.compile(r"(?i)loading (?:checkpoint|model|weights|safetensors|pretrained)")
