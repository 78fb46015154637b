"""The stacks show ranks blocked in different collectives.

## What it detects
In the stack dumps of a hung job, every rank's main thread waits inside a torch.distributed
collective, but not the same one: one rank in `barrier` while the others are in `all_reduce`,
one in `broadcast` while the others are in `all_gather`, or the same collective called from
different places in the code. The rule names the odd ranks and both call sites. Without stack
dumps, the tracebacks the timeout left are the stacks: each rank's last traceback that ends in a
torch.distributed call says which collective it was blocked in (or, for a rank with no such
traceback, the collective its watchdog timed out in). With as many ranks on each side
no side is named (but when the two sides are a barrier and another collective, the barrier's
ranks are, at a lower confidence: a barrier only some ranks reach is the usual way ranks split
evenly); when a point-to-point call (send, recv) is involved neither is, since
a pipeline's stages send and receive by design — unless the stacks carry the calls' peers
(collect keeps torch.distributed's `src`/`dst`): a send to B pairs with B's receive from this
rank, and the rank that the unpaired calls wait on most (at least two, more than any other) is
named, e.g. a stage that receives from the wrong neighbour.

## Why it hangs or kills the job
Collectives match by order within a process group: a rank that calls a different collective (or
skips one, or adds one) pairs its call with the others' different call. The ranks then wait for
each other forever, or exchange mismatched buffers, until the timeout aborts them.

## Evidence
py-spy dumps of every rank: the collective each group of ranks waits in and the user frame that
called it; or each rank's last traceback ending in a torch.distributed call (its timeout or lost
peer).

## Remedy
Make every rank issue the same collectives in the same order: look for a collective under a
rank-dependent condition (`if rank == 0: dist.barrier()`), an early `break` or `continue` on some
ranks, or a metric all-reduce that only some ranks reach. `TORCH_DISTRIBUTED_DEBUG=DETAIL`
reports such mismatches as they happen.

## Example
```
Process 4242: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    barrier (torch/distributed/distributed_c10d.py:4166)
    wrapper (torch/distributed/c10d_logger.py:83)
    save (train.py:71)
    main (train.py:90)
    <module> (train.py:99)

Process 4243: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4243 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    main (train.py:84)
    <module> (train.py:99)

Process 4244: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4244 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    main (train.py:84)
    <module> (train.py:99)
```
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TypeVar

from ddp_autopsy.analyzer import snapshots, stacktree
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.stackview import COLLECTIVES, is_backward_wait, wait_label
from ddp_autopsy.rules.base import Evidence, Finding, Rule, evidence_of, first_ts, rank_phrase
from ddp_autopsy.rules.coll.coll012_silent_ranks import DDP_COLLECTIVES, collective_frames
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE

#: The calls a blocked rank's traceback can end in: torch.distributed's blocking calls (not the
#: set-up ones, no collective to pair with), the non-blocking and coalesced point-to-point and
#: collective calls, and DDP's own broadcasts.
COLLECTIVE_CALLS = (COLLECTIVES - {"init_process_group", "new_group", "_store_based_barrier",
                                   "wait"}) \
    | {"isend", "irecv", "send_object_list", "recv_object_list", "all_reduce_coalesced",
       "all_gather_coalesced"} | {func for _, func in DDP_COLLECTIVES}
#: ProcessGroupNCCL's OpType names as the torch.distributed call that issues them.
WATCHDOG_CALLS = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather",
                  "_ALLGATHER_BASE": "all_gather_into_tensor", "REDUCE": "reduce",
                  "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE":
                  "reduce_scatter_tensor", "ALLTOALL": "all_to_all", "ALLTOALL_BASE":
                  "all_to_all_single", "BARRIER": "barrier", "GATHER": "gather",
                  "SCATTER": "scatter", "SEND": "send", "RECV": "recv"}
#: The OpTypes a torch.distributed call may show in ProcessGroupNCCL's watchdog line.
CALL_OPS = {call: {op} for op, call in WATCHDOG_CALLS.items()}
CALL_OPS["barrier"] = {"ALLREDUCE", "BARRIER"}
CALL_OPS["monitored_barrier"] = {"ALLREDUCE", "BARRIER"}
CALL_OPS["all_gather_into_tensor"] = {"_ALLGATHER_BASE", "ALLGATHER_INTO_TENSOR_COALESCED"}
CALL_OPS["reduce_scatter_tensor"] = {"_REDUCE_SCATTER_BASE", "REDUCE_SCATTER_TENSOR_COALESCED"}
for _call in ("_distributed_broadcast_coalesced", "_sync_module_states", "_sync_params_and_buffers",
              "broadcast_object_list"):
    CALL_OPS[_call] = {"BROADCAST"}
CALL_OPS["all_reduce_coalesced"] = {"ALLREDUCE", "ALLREDUCE_COALESCED"}
CALL_OPS["all_gather_object"] = {"ALLGATHER"}
#: torch.distributed's point-to-point calls: a pipeline's stages send and receive by design.
P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                 "recv_object_list"})


BARRIERS = frozenset({"barrier", "monitored_barrier"})
K = TypeVar("K")
#: Said when an even split is broken by its barrier side.
BARRIER_GUESS = (" As many ranks are on each side; the barrier's are named: a barrier that only"
                 " some ranks reach (under an `if`, in a helper some ranks skip) is the usual"
                 " way ranks split like this.")


def lone_barrier(ordered: list[K], op: Callable[[K], str] = str) -> K | None:
    """Of two calls that split the ranks evenly (``ordered``, their keys; ``op``, a key's
    call), the one that is a barrier, when only one is."""
    barriers = [k for k in ordered if op(k).split(" ", 1)[0] in BARRIERS]
    return barriers[0] if len(ordered) == 2 and len(barriers) == 1 else None


#: The point-to-point calls whose peer a stack's locals name, and which of them it is.
PEER_ARG = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}


def unpaired_peer(tree: stacktree.StackTree) -> tuple[int, list[tuple], dict] | None:
    """The rank the others' unpaired point-to-point calls wait on, when the stacks' locals name
    every peer: rank A's ``send(dst=B)`` pairs with B's ``recv(src=A)`` (or from any source),
    A's ``recv(src=B)`` with B's ``send(dst=A)``. Each call left unpaired counts against the
    peer it waits on; the rank counted against most, by at least two calls and strictly more
    than any other, is returned with the calls that wait on it ``(proc, op, "to"/"from",
    peer)`` and every rank's ``(call, peer)``. None when a rank's call or peer is unknown, or
    nothing stands out."""
    calls: dict[int, tuple[str, int | None]] = {}
    by_rank = tree.by_rank()
    for p in tree.procs:
        c = by_rank.get(p.rank) if p.rank is not None else None
        op = wait_label(c.collective).split(" ", 1)[0] if c and c.collective else None
        if p.rank is None or op is None:
            return None
        if op not in PEER_ARG:
            calls[p.rank] = (op, None)
            continue
        peer = p.call_args.get(PEER_ARG[op])
        if peer is None:
            return None
        calls[p.rank] = (op, None if peer == "None" else int(peer))
    against: dict[int, list[tuple]] = defaultdict(list)
    for p in tree.procs:
        op, peer = calls[p.rank]
        if op not in PEER_ARG or peer is None:
            continue
        other = calls.get(peer, ("", -1))
        sends = PEER_ARG[op] == "dst"
        paired = other[0] in PEER_ARG and PEER_ARG[other[0]] != PEER_ARG[op] \
            and other[1] in ((p.rank, None) if sends else (p.rank,))
        if not paired:
            against[peer].append((p, op, "to" if sends else "from", peer))
    if not against:
        return None
    ordered = sorted(against, key=lambda r: -len(against[r]))
    top = ordered[0]
    runner_up = len(against[ordered[1]]) if len(ordered) > 1 else 0
    if len(against[top]) < 2 or runner_up == len(against[top]):
        return None
    return top, against[top], calls


class RanksInDifferentCollectives(Rule):
    code = "COLL011"
    slug = "ranks-in-different-collectives"
    cause = "collective_mismatch"
    requires = ()  # the stacks, or the tracebacks the timeouts left
    optional = ("stack_tree", "events", "crashes")

    def check(self, job: Job) -> Iterator[Finding]:
        if job.stacks.height:
            yield from self._stacks(job)
        elif not job.fr_dumps.height and job.has("events"):
            yield from self._tracebacks(job)

    def _tracebacks(self, job: Job) -> Iterator[Finding]:
        # Only ranks whose last traceback is a wait that ended (a timeout, a lost peer) in a
        # collective call: one that raised its own error there crashed (CRASH001's), and a
        # helper (init_process_group, _get_default_group) is no collective to pair with.
        where = {rank: row for rank, row in collective_frames(job).items()
                 if row["data"]["frame"]["func"] in COLLECTIVE_CALLS
                 and CONSEQUENCE.search(row["text"])}
        calls: dict[str, list[int]] = defaultdict(list)
        for rank, row in sorted(where.items()):
            calls[row["data"]["frame"]["func"]].append(rank)
        if where:
            # (a rank with no such traceback whose watchdog named the collective it timed out
            # in was in that collective: ProcessGroupNCCL's OpType, as the Python call)
            # (the same collective as a traceback's when its OpType is what that call issues:
            # a barrier is NCCL's one-element ALLREDUCE, DDP's buffer sync a BROADCAST)
            timeouts = job.rows("watchdog_timeout")
            # (a collective number a traceback's rank also timed out at is that rank's call)
            traced = {r["data"].get("seq") for r in timeouts if r["rank"] in where} - {None}
            for r in timeouts:
                op = str(r["data"].get("op"))
                call = next((c for c in calls if op in CALL_OPS.get(c, ())), None) \
                    or (None if r["data"].get("seq") in traced else WATCHDOG_CALLS.get(op))
                if call and r["rank"] is not None and r["rank"] not in where:
                    where[r["rank"]] = r
                    calls[call].append(r["rank"])
        if len(calls) < 2 or len(where) < 2:
            return
        ordered = sorted(calls, key=lambda op: (-len(calls[op]), op))
        top, odd = ordered[0], ordered[1:]
        tie = len(calls[top]) == len(calls[ordered[1]])
        p2p = any(op in P2P for op in calls)
        lone = lone_barrier(ordered) if tie and not p2p else None
        if lone is not None:  # the barrier side of an even split: named, as the likelier
            top, odd, tie = next(op for op in ordered if op != lone), [lone], False
            ordered = [top, lone]
        odd_ranks = [] if tie or p2p else sorted(r for op in odd for r in calls[op])

        def side(op: str) -> str:
            ranks = calls[op]
            return f"{rank_phrase(ranks)} {'was' if len(ranks) == 1 else 'were'} in {op}"

        if p2p:
            summary = ("The ranks' last tracebacks end in different calls, point-to-point among "
                       "them: " + "; ".join(side(op) for op in ordered[:4]) + ". A send and a "
                       "receive that never paired (a wrong peer, or an order that differs "
                       "between ranks) leaves both waiting; which side is wrong the tracebacks "
                       "do not say.")
        elif tie:
            summary = ("The ranks' last tracebacks end in different collectives, which can "
                       "never match: " + "; ".join(side(op) for op in ordered[:4]) + ".")
        else:
            summary = (f"{side(odd[0])[0].upper()}{side(odd[0])[1:]}"
                       + "".join(f"; {side(op)}" for op in odd[1:3])
                       + f", while {side(top)}, as their last tracebacks"
                       + (" and watchdog timeouts" if any(
                           r["kind"] == "watchdog_timeout" for r in where.values()) else "")
                       + " show: the collectives do not match."
                       + (BARRIER_GUESS if lone is not None else ""))
        firsts = [where[calls[op][0]] for op in [*odd[:2], top]]
        yield self.finding(
            summary, evidence=[evidence_of(r) for r in firsts], ranks=odd_ranks,
            hosts=[where[r].get("host") for r in odd_ranks], confidence=0.45 if tie or p2p
            or lone is not None else 0.6, ts=first_ts(firsts),
            details={"calls": [{"collective": op, "ranks": calls[op]} for op in ordered]})

    def _stacks(self, job: Job) -> Iterator[Finding]:
        tree = job.stack_tree
        classes = tree.classes
        if len(tree) < 2 or not classes or any(c.collective is None for c in classes):
            return  # a rank outside any collective is COLL002's
        if any(is_backward_wait(c.collective) for c in classes):
            return  # some ranks in DDP's backward, others in a later collective: COLL004's
        if snapshots.moved(job.snapshot_moves, tree.procs):
            return  # a collective completed between stack snapshots: ranks only passing by
        # Ranks waiting in the same call (collective and the user frame that made it) agree.
        calls: dict[tuple[str, str], list] = defaultdict(list)
        for c in classes:
            site = str(c.user_frame) if c.user_frame else ""
            calls[(wait_label(c.collective), site)].append(c)
        if len(calls) < 2:
            return
        sizes = {k: sum(c.size for c in cs) for k, cs in calls.items()}
        ordered = sorted(sizes, key=lambda k: -sizes[k])
        top, odd = ordered[0], ordered[1:]
        tie = sizes[top] == sizes[ordered[1]]
        p2p = any(k[0].split(" ", 1)[0] in P2P for k in calls)
        lone = lone_barrier(ordered, lambda k: k[0]) if tie and not p2p else None
        if lone is not None:  # the barrier side of an even split: named, as the likelier
            top, odd, tie = next(k for k in ordered if k != lone), [lone], False
            ordered = [top, lone]
        odd_procs = [p for k in (ordered if tie else odd) for c in calls[k]
                     for p in tree.members(c.members)]
        ranks = [p.rank for p in odd_procs if p.rank is not None]
        if not tie and job.has("events") and set(ranks) & job.crashes.ranks:
            return  # its program raised: it waits in its exit path's collective (CRASH001's)

        def where(key: tuple[str, str]) -> str:
            procs = [p for c in calls[key] for p in tree.members(c.members)]
            verb = "waits" if len(procs) == 1 else "wait"
            return f"{stacktree.who(procs)} {verb} in {key[0]}" + (
                f" called from {key[1]}" if key[1] else "")

        # wait labels look like "send", "recv (gloo)": point-to-point calls pair by design
        unpaired = unpaired_peer(tree) if p2p else None
        if unpaired is not None:
            blamed, waiting_on, calls_of = unpaired
            odd_procs = [p for p in tree.procs if p.rank == blamed]
            ranks = [blamed]
            op, peer = calls_of[blamed]
            own = f" while rank {blamed} waits in {op}" + (
                "" if op not in PEER_ARG else
                f" {'to' if PEER_ARG[op] == 'dst' else 'from'} {peer if peer is not None else 'any'}")
            summary = (f"Rank {blamed} does not answer the point-to-point calls that wait on "
                       "it: " + "; ".join(f"rank {p.rank} waits in {op} {arrow} {peer}"
                                          for p, op, arrow, peer in waiting_on[:6])
                       + f"{own}. Its peer (src/dst), or its order of sends and receives, is "
                       "not the one the others expect.")
        elif p2p:
            summary = ("Ranks wait in different calls, point-to-point among them: "
                       + "; ".join(where(k) for k in ordered[:4]) + ". A send and a receive that "
                       "never paired (a wrong peer, or an order that differs between ranks) "
                       "leaves both waiting; which side is wrong the stacks do not say.")
        elif tie:
            summary = ("Ranks wait in different collectives, which can never match: "
                       + "; ".join(where(k) for k in ordered[:4]) + ".")
        else:
            first = where(odd[0])
            summary = (f"{first[0].upper()}{first[1:]}"
                       + "".join(f"; {where(k)}" for k in odd[1:3])
                       + f", while {where(top)}: the collectives do not match."
                       + (BARRIER_GUESS if lone is not None else ""))
        evidence = []
        for k in [*odd[:2], top]:
            c = calls[k][0]
            p = tree.members(c.members)[0]
            evidence.append(Evidence(path=p.source, line=None, rank=p.rank, host=p.host,
                                     text=f"{p.label} (pid {p.pid}): {c.collective}"
                                          + (f" ← {c.user_frame}" if c.user_frame else "")))
        named = unpaired is not None or not (tie or p2p)
        yield self.finding(
            summary, evidence=evidence, ranks=ranks if named else [],
            hosts=[p.host for p in odd_procs],
            confidence=0.5 if lone is not None else 0.8 if named else 0.5,
            details={"calls": [{"collective": k[0], "site": k[1] or None, "ranks": sorted(
                p.rank for c in calls[k] for p in tree.members(c.members) if p.rank is not None)}
                for k in ordered]},
        )
