"""A rank is somewhere else while the other ranks wait in a collective.

## What it detects
In the stack dumps of a hung job, most ranks' main threads wait inside a torch.distributed
collective (all_reduce, barrier, broadcast...) while one or a few ranks are elsewhere: in
evaluation or a checkpoint save that only rank 0 runs, inside a DataLoader `__getitem__`, in
I/O. The rule names the frame those ranks are in.

## Why it hangs or kills the job
A collective completes only when every rank enters it. The waiting ranks block until the odd
rank arrives; if it never does (or arrives later than the timeout), the job hangs and then the
watchdog kills it.

## Evidence
py-spy dumps of every rank (from `ddp-autopsy collect`, or `py-spy dump` output in the logs):
the collective the majority waits in, and the innermost user frame of the odd ranks. `collect`
samples every rank a few times, a random gap apart: when the waiting ranks moved between the
samples, their collective completed and the job is only between two steps, so nothing is said.

## Remedy
Make the odd rank's work collective-free or shared: run evaluation on every rank (shard the
eval set) or put a `dist.barrier()` after rank-0-only work and raise the timeout
(`init_process_group(timeout=...)`) to cover it; fix the blocking data loader or I/O (timeouts
on remote storage, `DataLoader(timeout=...)`).

## Example
```
Process 4242: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    evaluate (train.py:30)
    main (train.py:52)
    <module> (train.py:60)

Process 4243: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4243 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    main (train.py:48)
    <module> (train.py:60)

Process 4244: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4244 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    main (train.py:48)
    <module> (train.py:60)
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer import snapshots, stacktree
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.stackview import wait_label
from ddp_autopsy.rules.base import Evidence, Finding, Rule, rank_phrase

#: A frame's name that says it blocks on something other than a peer: a lock (filelock's
#: acquire, fcntl.flock), a sleep-poll, a download.
BLOCKED_FUNC = re.compile(r"(?i)acquire|lock|sleep|download|urlopen|poll")


class RankStuckOutsideCollective(Rule):
    code = "COLL002"
    slug = "rank-stuck-outside-collective"
    cause = "rank_stuck_outside_collective"
    requires = ("stacks",)
    optional = ("rank_state",)

    def check(self, job: Job) -> Iterator[Finding]:
        tree = job.stack_tree
        if len(tree) < 2:
            return
        waiting = [c for c in tree.classes if c.collective is not None]
        outside = [c for c in tree.classes if c.collective is None]
        n_wait = sum(c.size for c in waiting)
        n_out = sum(c.size for c in outside)
        if not waiting or not outside:
            return
        waiters = [p for c in waiting for p in tree.members(c.members)]
        if snapshots.moved(job.snapshot_moves, waiters):
            return  # their collective completed between stack snapshots: the job moves on
        procs = [p for c in outside for p in tree.members(c.members)]
        # (more ranks outside than in it: the few may only be early, and the others computing
        # on, or waiting in an asynchronous collective's work.wait(), which py-spy shows as the
        # caller's own frame; unless those outside are blocked in a lock, a sleep or a download
        # by their frame's name, idle where py-spy saw them, and every rank stood still over
        # the snapshots)
        if n_out > n_wait and not (
                all(c.idle == c.size and c.user_frame is not None
                    and BLOCKED_FUNC.search(c.user_frame.func) for c in outside)
                and snapshots.all_still(job.snapshot_moves, [*waiters, *procs])):
            return
        top = max(waiting, key=lambda c: c.size)
        op = wait_label(top.collective)
        places = []
        for c in outside:
            frame = c.user_frame
            where = f"{frame.func} ({frame.file}:{frame.line})" if frame else "an unknown frame"
            kind = f" ({c.place})" if c.place else ""
            members = tree.members(c.members)
            places.append(f"{stacktree.who(members)} {'is' if len(members) == 1 else 'are'} "
                          f"in {where}{kind}")
        ranks = [p.rank for p in procs]
        who = rank_phrase([r for r in ranks if r is not None]) if None not in ranks \
            else stacktree.who(procs)
        evidence = []
        for c in [*outside[:2], top]:
            p = tree.members(c.members)[0]
            frame = c.collective or c.user_frame
            evidence.append(Evidence(path=p.source, line=None, rank=p.rank, host=p.host,
                                     text=f"{p.label} (pid {p.pid}): {frame}"))
        first = outside[0].user_frame
        seen = snapshots.still(job.snapshot_moves)
        table = job.rank_state
        frozen = [f"rank {r} is frozen: {why}" for r, why in table.filter(
            (pl.col("state") == "frozen") & pl.col("rank").is_in(
                [r for r in ranks if r is not None])).select("rank", "why").iter_rows()]
        yield self.finding(
            f"{who[0].upper()}{who[1:]} never reached the collective: {n_wait} of "
            f"{len(tree)} ranks wait in {op} while {'; '.join(places)}"
            + (f" (the same in {seen} stack snapshots)." if seen > 1 else ".")
            + (f" {'; '.join(frozen)[0].upper()}{'; '.join(frozen)[1:]}." if frozen else ""),
            evidence=evidence,
            ranks=ranks,
            hosts=[p.host for p in procs],
            confidence=0.6 if n_out > n_wait else 0.85 if n_wait >= 2 else 0.7,
            details={
                "collective": op,
                "frame": first.func if first else None,
                "file": first.file if first else None,
                "line": first.line if first else None,
                "place": outside[0].place,
                "stack_class": outside[0].id,
                "snapshots": seen or 1,
                "waiting_ranks": sorted(p.rank for c in waiting for p in tree.members(c.members)
                                        if p.rank is not None),
            },
        )
