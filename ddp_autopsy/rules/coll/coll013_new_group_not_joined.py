"""Ranks of a running job did not reach a `new_group` call the others wait in.

## What it detects
torch's store-based barrier of a process group created after the default one
(`store_based_barrier_key:N`, N > 1, one per `torch.distributed.new_group`; torch 2.x keys it by
the group's name, N > 0, and words its count "num_workers_joined=") keeps waiting with
fewer workers than the world size, and never completes: "Waiting in store based barrier to initialize process group
for rank: 2, key: store_based_barrier_key:2 (world_size=8, worker_count=7, timeout=0:30:00)".
Every rank passed the default group's barrier already, so the missing ones are alive but
somewhere else.

torch 2.x creates a new group's Gloo pairs by publishing each rank's address in the store: the
group's ranks that timed out reading a peer's address in that group ("DistStoreError: wait timeout
after 1800000ms, keys: /default_pg/0//2//cpu//0/0": group "2", rank 0's address), while that
peer timed out in no group and did not crash, name the rank that had not reached the call.

## Why it hangs or kills the job
`new_group` is collective: every rank of the job must call it, in the same order, even ranks
that will not be members. A rank that skips it (a `new_group` under `if rank == ...`), calls it
later (after rank-local work), or creates groups in a different order leaves the others waiting
in the barrier until its timeout.

## Evidence
The barrier lines with the key, the world size and the count of workers that arrived; the ranks
that wait there (the missing ones are named when every waiting rank printed the line).

## Remedy
Call every `new_group` on every rank, unconditionally and in the same order (create the groups
right after `init_process_group`); move rank-local work after the group creation, or raise the
group timeout if that work is legitimately long.

## Example
```
I0510 07:28:04.417845 139863945226048 distributed_c10d.py:337] Waiting in store based barrier to initialize process group for rank: 2, key: store_based_barrier_key:2 (world_size=4, worker_count=3, timeout=0:30:00)
I0510 07:28:04.428285 140051304576832 distributed_c10d.py:337] Waiting in store based barrier to initialize process group for rank: 1, key: store_based_barrier_key:2 (world_size=4, worker_count=3, timeout=0:30:00)
I0510 07:28:04.431120 140051304576832 distributed_c10d.py:337] Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:2 (world_size=4, worker_count=3, timeout=0:30:00)
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, rank_phrase
from ddp_autopsy.rules.rdzv.rdzv004_missing_ranks import RANK_KEY, barrier_key, later_group


class NewGroupNotJoined(Rule):
    code = "COLL013"
    slug = "new-group-not-joined"
    cause = "rank_stuck_outside_collective"

    def check(self, job: Job) -> Iterator[Finding]:
        yield from self._barrier(job)
        yield from self._address_keys(job)

    def _address_keys(self, job: Job) -> Iterator[Finding]:
        """torch 2.x: the ranks of a new group timed out in the store waiting for a peer's
        address in that group ("keys: /default_pg/0//2//cpu//0/0": group 2, rank 0's), and that
        rank timed out in no group of its own and did not crash: it had not reached the
        `new_group` call. (Ranks in different groups are COLL001's.)"""
        awaited: dict[str, set[int]] = {}
        rows: list[dict] = []
        groups: dict[int, str] = {}
        for r in job.rows("store_wait_timeout"):
            keys = str(r["data"].get("keys") or "")
            m = RANK_KEY.search(keys)
            if r["rank"] is None or m is None or not later_group(keys):
                continue
            group = keys.split(",")[0].strip().split("//")[1]
            groups.setdefault(r["rank"], group)
            awaited.setdefault(group, set()).add(int(m.group(1)))
            rows.append(r)
        if len(set(groups.values())) != 1:
            return
        group = next(iter(groups.values()))
        # The key's last number is the peer's rank in the group, not in the job: it is the job's
        # when the group is the whole job as far as the inputs show (the waiting ranks and the
        # awaited ones are 0..n).
        waiting = set(groups)
        whole = waiting | awaited[group] == set(range(len(waiting | awaited[group])))
        missing = (awaited[group] - waiting - set(job.crashes.ranks)) if whole else set()
        if whole and not missing:
            return
        who = (rank_phrase(missing).capitalize() if missing else
               f"The group's rank {', '.join(map(str, sorted(awaited[group])))} (a member other "
               f"than {rank_phrase(sorted(waiting))}; its rank in the job the key does not say)")
        yield self.from_rows(
            rows, f"{who} never reached the `new_group` call that "
            f"{rank_phrase(sorted(waiting))} timed out in: their store reads waited for "
            f"its address in group {group!r} ({rows[0]['data'].get('keys')}).", shown=2,
            ranks=missing, confidence=0.7 if missing else 0.5,
            details={"group": group, "waiting_ranks": sorted(waiting),
                     "group_ranks_awaited": sorted(awaited[group])})

    def _barrier(self, job: Job) -> Iterator[Finding]:
        done = {r["data"].get("key") for r in job.rows("store_barrier_done")}
        # (the barrier's progress lines, or its timeout: "Timed out initializing process group
        # in store based barrier on rank: 7, for key: store_based_barrier_key:32 (...)")
        rows = [r for r in job.rows("store_barrier_wait", "store_clients_timeout")
                if (barrier_key(r) or 0) > 1 and r["data"].get("rank") is not None
                and r["data"]["joined"] < r["data"]["world"]
                and r["data"].get("key") not in done]
        if not rows:
            return
        key = max(barrier_key(r) or 0 for r in rows)
        rows = [r for r in rows if barrier_key(r) == key]
        world = max(r["data"]["world"] for r in rows)
        joined = max(r["data"]["joined"] for r in rows)
        waiting = {r["data"]["rank"] for r in rows}
        missing = set(range(world)) - waiting if len(waiting) == joined else set()
        who = rank_phrase(missing, empty=f"{world - joined} of the {world} ranks")
        yield self.from_rows(
            rows, f"{who[0].upper()}{who[1:]} never reached the creation of new_group "
            f"#{key - 1} after the default group (store key {rows[0]['data'].get('key')}) "
            f"that {rank_phrase(waiting)} wait in: only {joined} of "
            f"{world} ranks arrived.", shown=2, ranks=missing, confidence=0.75,
            details={"barrier_key": key, "world_size": world, "worker_count": joined,
                     "waiting_ranks": sorted(waiting)})
