"""Ranks called different collectives at the same point.

## What it detects
Ranks disagree on the collective they are in: TORCH_DISTRIBUTED_DEBUG=DETAIL's "Detected
mismatch between collectives on ranks" (op type, tensor shape, dtype or sequence number
differ) and its shape check ("Error when verifying shape tensors for collective ALLREDUCE on
rank 0 ... Got shapes: 10": no rank named), accelerate's debug mode ("Cannot apply desired operation due to shape mismatches"),
the ranks' own prints of the tensor they pass to a collective, once each, where a few ranks'
shape is not the majority's ("Rank 0 tensor before allreduce: torch.Size([409600])" against
torch.Size([32768000]) on the seven others; not all_to_all, whose inputs may differ), or
watchdog timeouts where ranks report different operations for the same sequence
number (e.g. rank 0 in REDUCE #3742816 while the others are in _ALLGATHER_BASE #3742816; or the
same op with another NumelIn), or at
different sequence numbers of one process group (ranks 1-2 in BROADCAST #532339, rank 0 in
_ALLGATHER_BASE #532341; or a rank whose "last completed NCCL work" is past another's timed-out
one): the watchdog reports a rank's oldest unfinished work, so the rank ahead finished a collective
the others are still in, which only a different call there allows (not the source of a broadcast
one collective ahead of ranks still in it: the source finishes once its data has left); or Horovod's stall report
showing the ranks submitted different tensors rather than some ranks none (every rank missing
tensors of another op than the others, or ready sets of the stalled tensors that are disjoint and
cover the job); or
NCCL's own check: "Mismatched collective detected, please check your collective calls at and
around rank 39" (2.4-2.6), "Your program may be hanging, this may be caused by a collective
mismatch around rank 3", or DeepSpeed ZeRO-3's check of the parameters each rank fetched:
"disagreement between rank0 and rank6" (the ranks ran different modules, so they would gather
different parameters); or stacks in which every rank waits in the same rooted collective and
the root they name differs (broadcast's `src`, reduce's `dst`, from the call arguments collect
keeps): the ranks that name another root than most are the odd ones. As a suspicion (0.3): every rank of a one-machine job waiting in the same
collective at the same place, none missing or failed (their timeouts, or stack snapshots in which
none moved): with no network between them, arguments that differ (root/src, size, dtype, group)
are the likeliest reason. And ranks that timed out in a collective while every other rank's
last line says it finished ("Rank 4 completed", "training done"): the waiting ranks called a
collective the others never did; likewise a rank 0 that timed out in a collective after its
framework said training had ended ("`Trainer.fit` stopped: ..."). A suspicion only, naming no
rank: SGLang's scheduler watchdog, which takes the server down after no forward batch for its
timeout and prints the ranks' batch sizes beside it to find the de-synced one.

## Why it hangs or kills the job
Collectives are matched by order: when one rank calls broadcast where the others call
all_reduce, or a barrier that only some ranks reach, each side waits for a partner that is in a
different call, until the timeout (or they exchange wrongly sized data).

## Evidence
The fingerprints each rank reported; the rank whose fingerprint differs from the majority is
named as the culprit (with two ranks, both are named).

## Remedy
Make every rank issue the same collectives in the same order with the same shapes and dtypes:
look for collectives inside `if rank == 0:` branches, data-dependent control flow (early
`break`, skipped batches, a best-loss check computed with `dist.reduce` so only rank 0 knows the
result — use `all_reduce`), and differently sized tensors per rank.

## Example
```
[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=4, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))).Collectives differ in the following aspects: 	 Op type: BROADCASTvs ALLREDUCE
```
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer import snapshots, stacktree
from ddp_autopsy.analyzer.attribution import one_host
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.analyzer.stackview import wait_label
from ddp_autopsy.rules.base import (
    Evidence,
    Finding,
    Rule,
    evidence_of,
    excerpt,
    first_ts,
    rank_phrase,
)
from ddp_autopsy.rules.coll.coll015_horovod_stalled_tensors import horovod_split
from ddp_autopsy.rules.nccl.nccl004_network_error_runtime import same_call_stall

SEQ = re.compile(r"SequenceNumber=(\d+)")
#: A rooted collective's root as torch.distributed's frame holds it: the global rank first.
ROOT_ARGS = ("src", "dst", "group_src", "group_dst")


def _normalise(fp: str) -> str:
    """A fingerprint without its sequence number (compared per sequence number anyway)."""
    return SEQ.sub("", fp)


def _short(fp: str) -> str:
    op = re.search(r"OpType=(\w+)", fp)
    shape = re.search(r"TensorShape=\[([^\]]*)\]", fp)
    dtype = re.search(r"TensorDtypes=(\w+)", fp)
    parts = [op.group(1) if op else "?"]
    if shape:
        parts.append(f"shape [{shape.group(1)}]")
    if dtype:
        parts.append(dtype.group(1))
    return " ".join(parts)


#: A rank named in a program's own print: "Rank 3 tensor ...", "rank=3 ...", "[rank 3] ...".
SELF_NAMED = re.compile(r"(?i)\brank\s*[=:]?\s*(\d+)\b")

#: A rank's last line saying it is through (not a step or an epoch that ended).
FINISHED = re.compile(r"(?i)\b(?:completed|finished|done|exiting|all done)\b")
STEP = re.compile(r"(?i)\b(?:epoch|step|iter(?:ation)?)\s*[=:#]?\s*\d")


def finished_and_waiting(job: Job) -> tuple[dict[int, dict], set[int], list[dict]] | None:
    """(ranks whose last line says they finished -> that line, ranks that timed out or lost
    their peers in a collective, those rows) when every rank outside the second set finished
    and none of them failed; else None."""
    lost = [r for r in job.rows(*kinds_tagged("lost_peer")) if r["rank"] is not None]
    waiting = {r["rank"] for r in lost}
    if not waiting:
        return None
    last: dict[int, dict] = {}
    for r in job.rows("last_line"):
        if r["rank"] is not None and r["rank"] not in waiting:
            last[r["rank"]] = r
    failed = {r["rank"] for r in job.rows(*kinds_tagged("failure")) if r["rank"] is not None}
    done = {k: r for k, r in last.items() if FINISHED.search(r["text"])
            and not STEP.search(r["text"]) and k not in failed}
    if not done or len(done) != len(last):
        return None
    return done, waiting, lost


class CollectiveMismatch(Rule):
    code = "COLL001"
    slug = "collective-mismatch"
    cause = "collective_mismatch"
    severity = "critical"
    optional = ("collective_report",)

    def check(self, job: Job) -> Iterator[Finding]:
        yield from self._fingerprints(job)
        yield from self._watchdog_ops(job)
        yield from self._watchdog_seqs(job)
        yield from self._horovod_split(job)
        yield from self._nccl_check(job)
        yield from self._zero3_traces(job)
        yield from self._shape_check(job)
        yield from self._shape_prints(job)
        yield from self._group_keys(job)
        differ = list(self._different_roots(job))
        yield from differ or self._one_host_stall(job)
        yield from self._others_finished(job)
        yield from self._after_training_end(job)
        yield from self._serving_watchdog(job)

    def _serving_watchdog(self, job: Job) -> Iterator[Finding]:
        """SGLang's scheduler watchdog fired: no forward batch completed for its timeout, and
        it takes the server down. SGLang prints each rank's batch and memory-pool sizes before
        the line "to check whether there are de-sync issues": the ranks of a tensor- or
        data-parallel group stuck in a collective they do not agree on (another batch, another
        branch). A suspicion, at a low confidence; its soft mode only warns."""
        rows = [r for r in job.rows("serving_watchdog") if r["data"].get("soft") != "True"]
        if not rows:
            return
        secs = rows[0]["data"].get("secs")
        yield self.from_rows(
            rows, f"SGLang's scheduler watchdog fired: no forward batch completed for {secs} "
            "seconds, and it took the server down. Its processes were hung, most often in a "
            "collective the tensor- or data-parallel ranks do not agree on (a different batch or "
            "branch on one rank); SGLang prints each rank's batch and memory-pool sizes before "
            "this line to compare (the rank whose numbers differ is the odd one), and py-spy "
            "stacks of the schedulers when it can.", shown=2, ranks=(), confidence=0.35,
            details={"seconds": secs})

    def _after_training_end(self, job: Job) -> Iterator[Finding]:
        """A rank timed out in a collective after its framework said training had ended
        ("`Trainer.fit` stopped: ...", printed by rank 0): a collective after the loop that the
        other ranks, done and gone, never called (a barrier under `if trainer.is_global_zero:`,
        such as a checkpoint save)."""
        ends = job.rows("training_end")
        if not ends:
            return
        # (Horovod's stall inspector runs in the coordinator, rank 0, whoever waits.)
        hang = [r for r in job.rows(*kinds_tagged("hang")) if not r["kind"].startswith("horovod_")
                and any(r["source"] == e["source"] and r["line"] > e["line"] for e in ends)]
        waiting = sorted({r["rank"] for r in hang if r["rank"] is not None})
        if not hang or len(waiting) != 1 or waiting[0] not in (0, None):
            return
        yield self.finding(
            f"Rank {waiting[0]} timed out in a collective after training had ended "
            f"(\"{excerpt(ends[0]['text'], 60)}\"): the other ranks were done and never called "
            "it. Look for a collective after the loop on rank 0 only (a barrier under `if "
            "trainer.is_global_zero:`, a checkpoint save or evaluation there).",
            evidence=[evidence_of(ends[0]), evidence_of(hang[0])], ranks=waiting,
            confidence=0.55, ts=first_ts(hang), details={"waiting": waiting})

    def _others_finished(self, job: Job) -> Iterator[Finding]:
        """Some ranks timed out in a collective (or lost their peers there) while every other
        rank's last line says it finished ("Rank 4 completed", "training done"), and those are
        the more: the waiting ranks called a collective the others never called (an extra
        barrier in rank-0-only code, a last all_reduce). The fewer finished ones instead ran out
        of data first: COLL004's uneven inputs."""
        split = finished_and_waiting(job)
        if split is None:
            return
        done, waiting, lost = split
        if len(waiting) >= len(done):
            return
        yield self.finding(
            f"{rank_phrase(waiting).capitalize()} timed out in a collective that the other ranks "
            f"never called: {rank_phrase(done)} had finished "
            f"(`{excerpt(next(iter(done.values()))['text'], 80)}`). Look for a collective only "
            "some ranks reach at the end (a barrier or all_reduce in rank-0-only code, an extra "
            "step on some ranks).",
            evidence=[evidence_of(lost[0]), evidence_of(next(iter(done.values())))],
            ranks=sorted(waiting), confidence=0.6, ts=first_ts(lost),
            details={"waiting": sorted(waiting), "finished": sorted(done)})

    def _different_roots(self, job: Job) -> Iterator[Finding]:
        """Every rank's stack waits in the same collective, and the root it names (broadcast's
        or reduce's ``src``/``dst``, from the locals collect keeps) is not the same on all: the
        ranks that name another root than the most do never meet the others."""
        if not job.stacks.height:
            return
        tree = job.stack_tree
        classes = tree.classes
        if len(tree) < 2 or not classes or any(c.collective is None for c in classes) \
                or len({wait_label(c.collective) for c in classes}) != 1 \
                or snapshots.moved(job.snapshot_moves, tree.procs):
            return
        roots: dict[str, list] = defaultdict(list)
        for p in tree.procs:
            given = p.call_args
            root = next((f"{k}={given[k]}" for k in ROOT_ARGS if given.get(k, "None") != "None"),
                        None)
            if root is None:
                return  # a rank whose root is not known: nothing to compare
            roots[root].append(p)
        if len(roots) < 2:
            return
        ordered = sorted(roots, key=lambda k: -len(roots[k]))
        tie = len(roots[ordered[0]]) == len(roots[ordered[1]])
        odd = [p for k in (ordered if tie else ordered[1:]) for p in roots[k]]
        op = wait_label(classes[0].collective)
        sides = "; ".join(f"{stacktree.who(roots[k])} with {k}" for k in ordered[:4])
        evidence = [Evidence(path=p.source, line=None, rank=p.rank, host=p.host,
                             text=f"{p.label} (pid {p.pid}): {op}({p.args})")
                    for p in [*odd[:2], roots[ordered[0]][0]]]
        yield self.finding(
            f"The ranks wait in {op} with different roots: {sides}. A collective's root must "
            "be the same on every rank; "
            + ("which side is wrong the stacks do not say." if tie else
               f"{stacktree.who(odd)} name{'s' if len(odd) == 1 else ''} another than the "
               "others."),
            evidence=evidence, ranks=[] if tie else [p.rank for p in odd if p.rank is not None],
            hosts=[p.host for p in odd], confidence=0.5 if tie else 0.85,
            details={"collective": op, "roots": {k: sorted(p.rank for p in roots[k]
                                                           if p.rank is not None)
                                                 for k in ordered}})

    def _one_host_stall(self, job: Job) -> Iterator[Finding]:
        """Every rank of a one-machine job waits in the same collective at the same place and
        none is missing or failed: no network links them, so the likeliest reason is that they
        disagree on its arguments (root/src, size, dtype, group), which Gloo and NCCL do not
        check. A suspicion: the remedy names the check that tells."""
        if not one_host(job) and not self._stacks_on_one_host(job):
            return
        if job.stacks.height:
            tree = job.stack_tree
            if len(tree) < 2 or len(tree.classes) != 1 or tree.classes[0].collective is None \
                    or snapshots.still(job.snapshot_moves) < 2 \
                    or snapshots.moved(job.snapshot_moves, tree.procs):
                return  # one snapshot, or ranks that moved: not shown to be stuck
            c = tree.classes[0]
            what = wait_label(c.collective) + (f" called from {c.user_frame}" if c.user_frame
                                               else "")
            p = tree.members(c.members)[0]
            evidence = [Evidence(path=p.source, line=None, rank=p.rank, host=p.host,
                                 text=f"{p.label} (pid {p.pid}): {c.collective}")]
            n, ts = len(tree), None
        else:
            stall = same_call_stall(job)
            if stall is None:
                return
            hang, ranks, what = stall
            evidence, n, ts = [evidence_of(r) for r in hang[:2]], len(ranks), first_ts(hang)
        yield self.finding(
            f"All {n} ranks wait in {what} on one machine and none is missing or failed: no "
            "network links them, so the likeliest reason is that they disagree on its arguments "
            "(the root or src rank, a size, a dtype, the group), which the backends do not "
            "check. TORCH_DISTRIBUTED_DEBUG=DETAIL names the rank that differs.",
            evidence=evidence, ranks=[], confidence=0.3, ts=ts,
            details={"collective": what, "ranks": n})

    @staticmethod
    def _stacks_on_one_host(job: Job) -> bool:
        if not job.stacks.height:
            return False
        hosts = {p.host for p in job.stack_tree.procs}
        return len(hosts) == 1 and None not in hosts

    def _zero3_traces(self, job: Job) -> Iterator[Finding]:
        """DeepSpeed ZeRO-3's own check: rank 0 and rank N fetched different sub-modules'
        parameters, so they would issue different all-gathers (no side is the odd one)."""
        rows = job.rows("zero3_trace_mismatch")
        if not rows:
            return
        others = sorted({r["data"]["other"] for r in rows if "other" in r["data"]})
        yield self.from_rows(
            rows, f"DeepSpeed ZeRO-3 found that rank 0 and {rank_phrase(others)} ran different "
            "modules (their traces of fetched parameters differ), so they would issue different "
            "parameter all-gathers: a data-dependent branch, an MoE expert, or inputs that skip "
            "a module on some ranks.", shown=2, ranks=[], confidence=0.85,
            details={"ranks_compared": [0, *others]})

    def _shape_check(self, job: Job) -> Iterator[Finding]:
        """A debug mode's own check that the ranks' inputs to a collective have one shape
        (TORCH_DISTRIBUTED_DEBUG=DETAIL's "Error when verifying shape tensors for collective
        ALLREDUCE on rank 0", accelerate's "Cannot apply desired operation due to shape
        mismatches"). No rank is named: each reporting rank prints its own shape tensor, one
        element a line, which the lines after the message (each with its own prefix) do not
        give back reliably."""
        rows = job.rows("collective_shape_mismatch")
        if not rows:
            return
        ops = sorted({r["data"]["op"] for r in rows if r["data"].get("op")})
        where = f" {'/'.join(ops)}" if ops else ""
        yield self.from_rows(
            rows, f"The ranks called the collective{where} with inputs of different shapes (the "
            "debug mode's shape check failed): a size that depends on the rank's data, or a "
            "different tensor on some ranks.", shown=2, ranks=(), confidence=0.85)

    def _shape_prints(self, job: Job) -> Iterator[Finding]:
        """The ranks printed the shape of the tensor they pass to a collective ("Rank 0 tensor
        before allreduce: torch.Size([409600])"), once each, the job stopped there (a timeout, or
        a rank's last line is such a print), and the shapes differ: most ranks agree, a few do
        not. Every rank must pass the same shape (all_gather_into_tensor, a
        reduce, a broadcast): the few are the odd ones."""
        shapes: dict[str, dict[int, set[str]]] = {}
        rows_of: dict[str, list[dict]] = {}
        printed: Counter[tuple[str, int]] = Counter()
        for r in job.rows("rank_collective_shape"):
            label = r["data"]["label"]
            named = SELF_NAMED.search(label)
            rank = int(named.group(1)) if named else r["rank"]
            if rank is None:
                continue
            key = re.sub(r"\d+", "#", " ".join(label.lower().split()))
            shapes.setdefault(key, {}).setdefault(rank, set()).add(r["data"]["shape"])
            rows_of.setdefault(key, []).append(r)
            printed[(key, rank)] += 1
        # (a print the ranks made again, a later epoch's: that collective completed; and the
        # job must have stopped there: a timeout, or a print some rank's last line)
        lasts = {(r["source"], r["line"]) for r in job.rows("last_line")}
        if not job.rows(*kinds_tagged("hang")) and not any(
                (r["source"], r["line"]) in lasts for rs in rows_of.values() for r in rs):
            return
        for key, per_rank in sorted(shapes.items()):
            if any(printed[(key, rank)] > 1 for rank in per_rank):
                continue
            fixed = {rank: next(iter(v)) for rank, v in per_rank.items() if len(v) == 1}
            if len(fixed) < 3 or len(fixed) < len(per_rank) or len(set(fixed.values())) < 2:
                continue
            top, n_top = Counter(fixed.values()).most_common(1)[0]
            if n_top <= len(fixed) / 2:
                continue
            odd = sorted(rank for rank, v in fixed.items() if v != top)
            rows = sorted(rows_of[key], key=lambda r: (r["data"]["shape"] == top, r["line"]))
            said = ", ".join(f"rank {rank}: {fixed[rank]}" for rank in odd[:4])
            yield self.finding(
                f"The ranks printed different shapes for the tensor they pass to a collective: "
                f"{said} against {top} on the other {n_top}. Every rank must "
                f"pass the same shape, so the collective cannot complete; "
                f"{rank_phrase(odd)} {'is' if len(odd) == 1 else 'are'} the odd one"
                f"{'' if len(odd) == 1 else 's'}.",
                evidence=[evidence_of(r) for r in rows[:3]], ranks=odd, confidence=0.6,
                ts=first_ts(rows), details={"shapes": {str(k): v for k, v in sorted(
                    fixed.items())}})
            return

    def _group_keys(self, job: Job) -> Iterator[Finding]:
        """The ranks timed out in the store waiting for the peers' addresses of different
        process groups: "wait timeout after 10000ms, keys: /default_pg/0//2//cpu//0/0" on ranks
        1, 2 (group "2") against ".../0//1//cpu//0/2" on rank 0 (group "1"). Groups are named
        by a count every rank keeps (``new_group``'s order): the ranks disagree on how many they
        created, as when some skipped a ``new_group``. Named: the minority, or on a tie the ranks
        of the lower count (the ones behind)."""
        group_of: dict[int, str] = {}
        rows: list[dict] = []
        for r in job.rows("store_wait_timeout"):
            parts = str(r["data"].get("keys") or "").split(",")[0].strip().split("//")
            if r["rank"] is None or len(parts) < 4 or not parts[1].isdigit():
                # (the default group's keys name no group: "/default_pg/0//cuda//0"; a hashed
                # name, use_hashed_name, is the group's members, not a count)
                continue
            group_of.setdefault(r["rank"], parts[1])
            rows.append(r)
        if len(set(group_of.values())) < 2:
            return
        culprits, majority = _minority(group_of)
        if not majority:
            low = min(group_of.values(), key=int)
            culprits = sorted(r for r, g in group_of.items() if g == low)
        said = "; ".join(f"{rank_phrase(sorted(r for r, g in group_of.items() if g == name))} "
                         f"in group {name!r}" for name in sorted(set(group_of.values())))
        yield self.finding(
            f"The ranks timed out creating different process groups ({said}): groups are "
            "numbered in the order every rank creates them, so the ranks did not call the same "
            f"`new_group`s; {rank_phrase(culprits)} skipped one, or called one the others did "
            "not (a `new_group` under an `if`).",
            evidence=[evidence_of(r) for r in _prefer(rows, culprits)[:3]], ranks=culprits,
            confidence=0.8, ts=first_ts(rows), details={"groups": {
                str(k): v for k, v in sorted(group_of.items())}})

    def _nccl_check(self, job: Job) -> Iterator[Finding]:
        """NCCL's own check: "... collective mismatch around rank N" (a rank that called a
        different collective, or in a different order, than its peers)."""
        rows = job.rows("nccl_collective_mismatch")
        if not rows:
            return
        around = sorted({r["data"]["around"] for r in rows if "around" in r["data"]})
        yield self.from_rows(
            rows, f"NCCL found mismatched collectives around {rank_phrase(around)}: the ranks "
            "called different collectives, or the same ones in a different order or with "
            "different sizes.", shown=2, ranks=around, confidence=0.75,
            details={"around": around})

    def _fingerprints(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("collective_fingerprint_mismatch")
        if not rows:
            return
        # A rank's own fingerprint first: what it reports of a peer can be the fingerprint
        # check's own exchange gone out of step (SequenceNumber=0, OpType=GATHER).
        fp_of: dict[int, str] = {r["data"]["r1"]: r["data"]["fp1"] for r in reversed(rows)}
        for r in rows:
            if "r2" in r["data"]:  # absent where the message was cut after the first one
                fp_of.setdefault(r["data"]["r2"], r["data"]["fp2"])
        if len(fp_of) < 2:
            (rank, fp), = fp_of.items()
            yield self.finding(
                f"The ranks called different collectives (the fingerprint check found a "
                f"mismatch; rank {rank} was running {_short(fp)}; the rest of the message is "
                "missing, so which rank is the odd one is not known).",
                evidence=[evidence_of(rows[0])], ranks=[], confidence=0.8, ts=first_ts(rows),
                details={"fingerprints": {str(rank): fp}})
            return
        normal = {k: _normalise(v) for k, v in fp_of.items()}
        if len(set(normal.values())) == 1:
            # the same call at different sequence numbers ("SequenceNumber=1OpType=BARRIER" on
            # one rank, "=0" on the other): one rank ran a collective more, or one less
            where = "; ".join(f"rank {k} at #{SEQ.search(fp).group(1) if SEQ.search(fp) else '?'}"
                              for k, fp in sorted(fp_of.items()))
            yield self.finding(
                f"The ranks ran the same call, {_short(next(iter(fp_of.values())))}, at different "
                f"points of their sequence of collectives ({where}): one of them ran a "
                "collective more than the others before it, or one less.",
                evidence=[evidence_of(r) for r in rows[:2]], ranks=[], confidence=0.85,
                ts=first_ts(rows), details={"fingerprints": {str(k): v for k, v in
                                                             sorted(fp_of.items())}})
            return
        culprits, majority = _minority(normal)
        odd = {_short(fp_of[r]) for r in culprits}
        usual = _short(next(fp for r, fp in fp_of.items() if r not in culprits)) \
            if len(culprits) < len(fp_of) else None
        summary = f"{rank_phrase(culprits).capitalize()} called {', '.join(sorted(odd))}"
        summary += f" where the other ranks called {usual}" if usual else "; the ranks disagree"
        summary += (" (as many ranks on each side: rank 0's is the likelier odd one, rank-0-only "
                    "code being the usual reason)." if not majority and usual else ".")
        seqs = sorted({int(m) for fp in fp_of.values() for m in SEQ.findall(fp)})
        yield self.finding(
            summary,
            evidence=[evidence_of(r) for r in _prefer(rows, culprits)[:2]],
            ranks=culprits,
            confidence=0.95 if majority else 0.85,
            ts=first_ts(rows),
            details={"fingerprints": {str(k): v for k, v in sorted(fp_of.items())},
                     "sequence_numbers": seqs},
        )

    def _watchdog_ops(self, job: Job) -> Iterator[Finding]:
        by_seq: dict[int, dict[int, str]] = defaultdict(dict)
        rows_by_seq: dict[int, list] = defaultdict(list)
        for seq, timed in timeouts_by_seq(job).items():
            sized = {r["data"]["op"] for _, r in timed
                     if r["data"].get("op") and r["data"].get("nin") is not None}
            for rank, r in timed:
                d = r["data"]
                if not d.get("op"):
                    continue  # (a line cut before its op: says nothing of which call)
                if d.get("nin") is None and d["op"] in sized:
                    continue  # (cut before its size: any of the op's sizes the others ran)
                # (the same op with another size is another call too: a 1-element metric
                # against a gradient bucket)
                by_seq[seq][rank] = d["op"] + (f" of {d['nin']} elements"
                                               if d.get("nin") is not None else "")
                rows_by_seq[seq].append(r)
        for seq, ops in sorted(by_seq.items()):
            if len(set(ops.values())) < 2:
                continue
            culprits, majority = _minority(ops)
            odd = sorted({ops[r] for r in culprits})
            others = sorted({op for r, op in ops.items() if r not in culprits})
            rows = rows_by_seq[seq]
            if others:
                said = (f"At collective #{seq}, {rank_phrase(culprits)} ran {', '.join(odd)} "
                        f"while the other ranks ran {', '.join(others)}"
                        + (" (as many ranks on each side: rank 0's is the likelier odd one)."
                           if not majority else "."))
            else:  # one rank per side, rank 0 on neither: which is odd the lines do not say
                said = (f"At collective #{seq} the ranks ran different calls: "
                        + "; ".join(f"rank {r} {op}" for r, op in sorted(ops.items()))
                        + " (which side is the odd one these lines do not say).")
            yield self.finding(
                said,
                evidence=[evidence_of(r) for r in _prefer(rows, culprits)[:3]],
                ranks=culprits,
                confidence=0.85 if majority else 0.7,
                ts=first_ts(rows),
                details={"sequence_number": seq, "ops": {str(k): v for k, v in ops.items()}},
            )


    def _watchdog_seqs(self, job: Job) -> Iterator[Finding]:
        """Logs only: in one process group the watchdog timed ranks out at different
        collectives. The watchdog reports a rank's oldest unfinished work, so a rank that timed
        out at #N+k (or says it completed #N) finished #N, which another rank is still in: one
        collective can only finish on some ranks when they called different ones there (a
        1-element all_reduce against a large one, another op, a call only some ranks make)."""
        for g in job.collective_report.groups:
            if g.fr:
                continue
            with_op = {r: st for r, st in g.ranks.items()
                       if st.timed_out_at is not None and st.timed_out_op
                       and st.timed_out_op.upper() not in P2P_OPS}
            # (a rank whose watchdog summary alone is shown, "failure detected by watchdog at
            # work sequence id: 5 ... last completed work: 4", can only be ahead: its op is
            # needed on the side that stays behind)
            timed = with_op | {r: st for r, st in g.ranks.items()
                               if st.timed_out_at is not None and not st.timed_out_op}
            if len(timed) < 2 or not with_op:
                continue
            low = min(st.timed_out_at for st in with_op.values())
            ahead = {r for r, st in timed.items() if st.timed_out_at > low
                     or (st.last_completed is not None and st.last_completed >= low)}
            if not ahead or not set(with_op) - ahead or set(timed) - ahead - set(with_op):
                continue
            behind_ops = {st.timed_out_op.upper() for r, st in timed.items() if r not in ahead}
            if behind_ops == {"BROADCAST"} and all(
                    timed[r].timed_out_at == low + 1 for r in ahead):
                # A broadcast's source finishes it once its data has left, so it is one
                # collective ahead of receivers that never got the data: no mismatch in that.
                continue
            where = {r: f"{st.timed_out_op or 'collective'} #{st.timed_out_at}"
                     for r, st in timed.items()}
            culprits, majority = _minority(where)
            behind = sorted(set(timed) - ahead)
            stuck = ", ".join(sorted({where[r] for r in behind}))
            past = ", ".join(sorted({where[r] for r in ahead}))
            yield self.finding(
                f"In {g.label} the ranks timed out at different collectives: "
                f"{rank_phrase(behind)} in {stuck}, {rank_phrase(ahead)} already past it, in "
                f"{past}. A collective can finish on some ranks only when they called a "
                f"different one there (another op or size, or a call only some ranks make), so "
                f"the ranks' sequences of collectives diverged at #{low}"
                + (f"; {rank_phrase(culprits)} {'is' if len(culprits) == 1 else 'are'} the "
                   "odd one" + ("s." if len(culprits) > 1 else ".")
                   if majority and culprits else "."),
                evidence=[evidence_of(r) for r in _prefer(g.log_rows, culprits)[:3]],
                ranks=culprits if majority else (), confidence=0.6,
                ts=first_ts(g.log_rows),
                details={"process_group": g.name, "timed_out": {str(r): w for r, w in
                                                                sorted(where.items())}})


    def _horovod_split(self, job: Job) -> Iterator[Finding]:
        """Horovod's stall report showing the ranks submitted different tensors (see
        coll015.horovod_split): a mismatch, the smallest side named when it is the only one."""
        split = horovod_split(job)
        if split is None:
            return
        sides, rows = split
        small = min(len(r) for r in sides.values())
        smallest = [r for r in sides.values() if len(r) == small]
        odd = smallest[0] if len(smallest) == 1 else set()
        said = "; ".join(f"{rank_phrase(r)} {what}" for what, r in
                         sorted(sides.items(), key=lambda kv: min(kv[1])))
        yield self.from_rows(
            [*job.rows("horovod_stall")[:1], *rows[:2]],
            f"Horovod's stall inspector shows the ranks submitted different tensors, not some "
            f"ranks none: {said}. They run different collectives (a broadcast against an "
            "allreduce, tensors of another name or shape): program order differs between ranks"
            + (f"; {rank_phrase(odd)}, the smaller side, is the odd one." if odd else "."),
            shown=3, ranks=odd, confidence=0.7,
            details={"sides": {k: sorted(v) for k, v in sides.items()}})


#: Point-to-point ops: their sequence numbers are not the collectives'.
P2P_OPS = frozenset({"SEND", "RECV", "RECVANYSOURCE", "_COALESCED"})


def timeouts_by_seq(job: Job) -> dict[int, list[tuple[int, dict[str, Any]]]]:
    """Watchdog timeouts by the collective number they name: (rank, row) pairs in input order,
    the rank from the line, else the process-group rank its message names."""
    out: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for r in job.rows("watchdog_timeout"):
        rank = r["rank"] if r["rank"] is not None else r["data"].get("pgrank")
        if rank is not None and r["data"].get("seq") is not None:
            out[r["data"]["seq"]].append((rank, r))
    return out


def _minority(value_of: dict[int, str]) -> tuple[set[int], bool]:
    """Ranks whose value differs from the most common one, and whether there is a majority. On
    a tie rank 0's side is the suspect (code under `if rank == 0`, such as checkpointing or
    logging, is the usual reason one side calls something else); without rank 0, all ranks."""
    counts = Counter(value_of.values())
    (top, n), *rest = counts.most_common()
    if rest and rest[0][1] == n:
        if 0 in value_of:
            return {r for r, v in value_of.items() if v == value_of[0]}, False
        return set(value_of), False
    return {r for r, v in value_of.items() if v != top}, True


def _prefer(rows: list, ranks: set[int]) -> list:
    return sorted(rows, key=lambda r: r["rank"] not in ranks)
