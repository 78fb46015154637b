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
the collective the majority waits in, and the innermost user frame of the odd ranks.

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

from collections import Counter
from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.stackview import RankStack, main_threads
from ddp_autopsy.rules.base import Evidence, Finding, Rule, rank_phrase


def _worker_stacks(job: Job) -> list[RankStack]:
    stacks = main_threads(job.stacks)
    if job.processes.height:
        agents = set(job.processes.filter(pl.col("role").is_in(["agent", "dataloader", "other"]))
                     ["pid"].to_list())
        stacks = [s for s in stacks if s.pid not in agents]
    return stacks


def _label(s: RankStack) -> str:
    return f"rank {s.rank}" if s.rank is not None else f"pid {s.pid}"


class RankStuckOutsideCollective(Rule):
    code = "COLL002"
    slug = "rank-stuck-outside-collective"
    cause = "rank_stuck_outside_collective"
    inputs = ("stacks",)

    def check(self, job: Job) -> Iterator[Finding]:
        stacks = _worker_stacks(job)
        if len(stacks) < 2:
            return
        waiting = [s for s in stacks if s.collective is not None]
        outside = [s for s in stacks if s.collective is None]
        if not waiting or not outside or len(outside) > len(waiting):
            return
        ops = Counter(s.collective.func for s in waiting if s.collective)
        op = ops.most_common(1)[0][0]
        places = []
        for s in outside:
            frame = s.user_frame
            where = f"{frame.func} ({frame.file}:{frame.line})" if frame else "an unknown frame"
            kind = f" ({s.place})" if s.place else ""
            places.append(f"{_label(s)} is in {where}{kind}")
        ranks = [s.rank for s in outside]
        who = rank_phrase([r for r in ranks if r is not None]) if all(
            r is not None for r in ranks) else ", ".join(_label(s) for s in outside)
        evidence = []
        for s in outside[:2] + waiting[:1]:
            frame = s.user_frame if s.collective is None else s.collective
            evidence.append(Evidence(path=s.source, line=None, rank=s.rank, host=s.host,
                                     text=f"{_label(s)} (pid {s.pid}): {frame}"))
        first = outside[0].user_frame
        yield self.finding(
            f"{who[0].upper()}{who[1:]} never reached the collective: {len(waiting)} of "
            f"{len(stacks)} ranks wait in {op} while {'; '.join(places)}.",
            evidence=evidence,
            ranks=ranks,
            hosts=[s.host for s in outside],
            confidence=0.85 if len(waiting) >= 2 else 0.7,
            details={
                "collective": op,
                "frame": first.func if first else None,
                "file": first.file if first else None,
                "line": first.line if first else None,
                "place": outside[0].place,
                "waiting_ranks": sorted(s.rank for s in waiting if s.rank is not None),
            },
        )
