"""Some ranks never joined the job.

## What it detects
The store host waited for clients that never came ("Timed out after 601 seconds waiting for
clients. 2/3 clients joined."), a store wait timed out on keys that other ranks should have set,
a desync report said ranks "never joined any collectives", a store read waited for a rank's own
key (Gloo's address of rank 3: "wait timeout after 10000ms, keys: /default_pg/0//cpu//0/3"), init_process_group's store-based
barrier kept waiting with fewer workers than the world size ("Waiting in store based barrier ...
key: store_based_barrier_key:1 (world_size=8, worker_count=7 ..."), or launcher messages show
fewer distinct ranks than the world size (e.g. two nodes both starting as ranks 0 and 1 of 4).
A store read that names no key at all ("Socket Timeout", "waitForInput: socket ... timed out
after 1800000ms") is not read as a join: it may as well be a peer busy or gone mid-run.

## Why it hangs or kills the job
Every collective needs all ranks; with ranks absent, the present ones wait until the timeout.

## Evidence
The timeout or barrier line with the joined/world counts, and which ranks left any trace in the
logs (the missing ones are named only when every present rank is accounted for).

## Remedy
Find why the missing ranks did not start: look at their node's logs (crash at import, wrong
node count, scheduler placed fewer tasks), check `--nnodes`/`--nproc-per-node` against
WORLD_SIZE, and `--ntasks-per-node` against the GPUs per node under SLURM.

## Example
```
[rank0]: torch.distributed.DistStoreError: Timed out after 11 seconds waiting for clients. 2/3 clients joined.
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, parse_ranks, rank_phrase
from ddp_autopsy.rules.coll.coll014_store_wait_for_busy_rank import busy_waits
from ddp_autopsy.rules.crash.crash001_rank_crashed import LOST_STORE


class MissingRanks(Rule):
    code = "RDZV004"
    slug = "missing-ranks"
    cause = "missing_ranks"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        present = set(job.ranks["rank"].to_list()) if job.ranks.height else set()
        named: set[int] = set()
        evidence_rows = []
        world = job.world_size
        # A desync report's "[2] finished collective #314, but didn't join collective #315" is a
        # rank that joined and fell behind: COLL009's laggard, not a rank missing from the job.
        # (A monitored barrier's missing ranks had joined the group: COLL012's, not these.)
        for r in job.rows("desync_never_joined"):
            named |= parse_ranks(r["data"].get("ranks"))
            evidence_rows.append(r)
        # More check-ins than the world size is a store holding an earlier run's (RDZV005).
        # (a store barrier's timeout past key #1 is a new_group's, after the job formed: COLL013's)
        clients = [r for r in job.rows("store_clients_timeout")
                   if r["data"]["joined"] < r["data"]["world"] and (barrier_key(r) or 1) == 1]
        evidence_rows += clients
        for r in clients:
            world = max(world or 0, r["data"]["world"])
            # (the store's server prints it and counts itself: with only it joined and no rank
            # seen, it is rank 0, the process that hosts the store under env:// and torchrun)
            seen = present | ({r["rank"]} if r["rank"] is not None else set()) or (
                {0} if r["data"]["joined"] == 1 else set())
            if len(seen) == r["data"]["joined"] and world:
                named |= set(range(world)) - seen
        # Launcher rank announcements (Lightning's "initializing ddp: GLOBAL_RANK: r, MEMBER: m/w").
        starts = [r for r in job.rows("run_start") if "world" in r["data"]]
        if starts:
            sw = max(r["data"]["world"] for r in starts)
            seen = {r["data"]["rank"] for r in starts}
            if len(seen) < sw:
                named |= set(range(sw)) - seen
                evidence_rows += starts[:2]
        # init_process_group's store-based barrier (key #1: the default group): the ranks
        # waiting there are in; fewer than the world size checked in.
        done = {r["data"].get("key") for r in job.rows("store_barrier_done")}
        barrier = [r for r in job.rows("store_barrier_wait")
                   if barrier_key(r) == 1 and r["data"]["joined"] < r["data"]["world"]
                   and r["data"].get("key") not in done]
        if barrier:
            world = max(world or 0, *(r["data"]["world"] for r in barrier))
            waiting = {r["data"]["rank"] for r in barrier}
            if len(waiting) == max(r["data"]["joined"] for r in barrier):
                named |= set(range(world)) - waiting
            evidence_rows += barrier[:2]
        # A store read that waited for a rank which had joined and was busy is COLL014's.
        busy = busy_waits(job)[0]
        # (a read that lost its connection says the store's host went away: CRASH001's)
        # (nor a read of a group created after the default one, "keys: /default_pg/0//2//cpu//
        # 0/0": every rank had joined the job; COLL001 reads the groups they disagree on)
        waits = [r for r in job.rows("store_wait_timeout") if r not in busy
                 and not LOST_STORE.search(r["data"].get("err") or "")
                 and not later_group(str(r["data"].get("keys") or ""))]
        # A store read of a rank's own key ("keys: /default_pg/0//cpu//0/3": the address Gloo's
        # connectFullMesh waits for, per peer rank) names the rank that never published it; a
        # rank beyond every one seen is a world size that differs (ENV002's).
        awaited = {int(m.group(1)) for r in waits
                   if (m := RANK_KEY.search(str(r["data"].get("keys") or "")))}
        waiting = {r["rank"] for r in waits if r["rank"] is not None}
        if awaited and not named and max(awaited) <= max(present | waiting | {-1}) \
                and not awaited & waiting:
            named |= awaited
        if not evidence_rows:
            keyed = [r for r in waits if RANK_KEY.search(str(r["data"].get("keys") or ""))]
            # A store read of no rank's key that timed out while ranks were timing out in
            # collectives is the store lost mid-run (its host's network), not a join.
            if not waits or (not keyed and any(
                    r["rank"] is not None for r in job.rows(*kinds_tagged("hang")))):
                return
            # (a read that names no key at all, "Socket Timeout" or the socket's own "timed out
            # after 600000ms", says nothing of what it waited for: a join, or a peer busy or gone
            # mid-run)
            if not keyed and not any(r["data"].get("keys") for r in waits):
                return
            evidence_rows = keyed or waits
        if clients:
            d = clients[0]["data"]
            how = f"only {d['joined']}/{d['world']} clients joined the store"
        elif barrier:
            d = barrier[-1]["data"]
            how = (f"only {d['joined']} of {d['world']} ranks reached init_process_group's "
                   "store barrier")
        elif awaited and named == awaited:
            key = next(str(r["data"]["keys"]) for r in waits
                       if RANK_KEY.search(str(r["data"].get("keys") or "")))
            how = f"the others' store reads waited for its own key ({key}) until they timed out"
        else:
            how = "they never arrived"
        who = rank_phrase(named) if named else "some ranks"
        yield self.finding(
            f"{who[0].upper()}{who[1:]} never joined: {how}.",
            evidence=[evidence_of(r) for r in evidence_rows[:3]],
            ranks=named,
            confidence=0.8 if named else 0.65,
            ts=first_ts(evidence_rows),
            details={"world_size": world, "present": sorted(present)},
        )


#: The trailing rank of a per-rank store key ("/default_pg/0//cpu//0/3", "/pg/1//cuda//0/7").
RANK_KEY = re.compile(r"/\d+//(?:cpu|cuda|\w+)//\d+/(\d+)\.?$")


def later_group(keys: str) -> bool:
    """Whether a store key is a process group's created after the default one (its name
    between the default store's prefix and the device: "/default_pg/0//2//cpu//0/0")."""
    parts = keys.split(",")[0].strip().split("//")
    return len(parts) >= 4 and bool(parts[1])


def barrier_key(row: dict[str, Any]) -> int | None:
    """The store barrier's group, numbered as torch < 2 did: 1 for init_process_group's default
    group, N for the N-1th ``new_group`` after it (``store_based_barrier_key:N``). torch 2.x
    keys the barrier by the group's name, "0" for the default group, "N" for the Nth new_group
    (and words its counts "num_workers_joined="): read one up."""
    key = str(row["data"].get("key", ""))
    tail = key.rsplit(":", 1)[-1]
    if not tail.isdigit():
        return None
    return int(tail) + (1 if "num_workers_joined" in row["text"] else 0)

