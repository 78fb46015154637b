"""Some ranks ran out of data and left the training loop.

## What it detects
In the stack dumps of a hung DDP job, most ranks wait in DDP's gradient all-reduce (idle inside
`loss.backward()`), while the other ranks have left the training loop: they wait in a different
collective after it (a final `barrier`, an evaluation `all_reduce`, `destroy_process_group`) or
their processes are gone. From logs alone: the ranks' watchdog timeouts at one collective number
with one op but different sizes (a gradient bucket of millions of elements against a 1-element
metric) when the ranks of the small one said they had started evaluating or validating.

## Why it hangs or kills the job
DDP all-reduces gradients in every backward pass, so every rank must run the same number of
steps. With uneven shards (a sampler that splits the data unevenly, `drop_last=False`,
dynamic batching), the ranks with fewer batches leave the loop while the others wait in
backward for a partner that never comes, until the timeout.

With DDP's Join context and `throw_on_early_termination=True`, the logs say it too: "Rank 1
exhausted all inputs." on the rank out of data, "Detected at least one rank that exhausted
inputs. Throwing across all ranks." on the others. So do training loops with a join check of
their own (CosyVoice's: "Detected uneven workload distribution: ...", after a monitored barrier
that names the rank that did not come back), and trainers that announce the worker whose epoch
ended first (AllenNLP: "Worker 0 completed its entire epoch (training)."). Without any of them, a
few ranks whose last line says they finished ("training done after 10 batches") while the more
others then timed out or lost them in their next collective. From tracebacks: most ranks timed
out in `loss.backward()` while the others timed out in a collective after the loop. From the
ranks' own prints of their data ("Rank = 2, Number of batches 8" against 4 on the others): counts
that differ between ranks.

## Evidence
py-spy dumps: the ranks in backward, and where the odd ranks are instead (or that they exited);
or the Join context's messages.

## Remedy
Give every rank the same number of steps: `DistributedSampler(drop_last=True)` or pad the
shards, cap the steps (`limit_train_batches`), or wrap the loop in DDP's Join context manager
(`with model.join(): ...`) so ranks that finish early shadow the others' all-reduces.

## Example
```
Process 700: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 700 (idle): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:979)
    backward (torch/autograd/__init__.py:395)
    Tensor.backward (torch/_tensor.py:623)
    main (train.py:33)

Process 701: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 701 (idle): "MainThread"
    barrier (torch/distributed/distributed_c10d.py:5356)
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
    main (train.py:37)

Process 702: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 702 (idle): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:979)
    backward (torch/autograd/__init__.py:395)
    Tensor.backward (torch/_tensor.py:623)
    main (train.py:33)
```
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer import snapshots, stacktree
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.analyzer.stackview import is_backward_wait
from ddp_autopsy.rules.base import (
    Evidence,
    Finding,
    Rule,
    came_before,
    evidence_of,
    excerpt,
    first_ts,
    rank_phrase,
)
from ddp_autopsy.rules.coll.coll001_collective_mismatch import finished_and_waiting, timeouts_by_seq
from ddp_autopsy.rules.coll.coll012_silent_ranks import backward_split, barrier_named
from ddp_autopsy.rules.coll.coll015_horovod_stalled_tensors import horovod_missing, most_missing


class UnevenInputs(Rule):
    code = "COLL004"
    slug = "uneven-inputs"
    cause = "uneven_inputs"
    severity = "critical"
    requires = ()  # the stacks, or the Join context's log lines
    optional = ("events", "stacks", "stack_tree")

    def check(self, job: Job) -> Iterator[Finding]:
        yield from self._join_exhausted(job)
        yield from self._finished_first(job)
        yield from self._left_for_evaluation(job)
        yield from self._ended_before_stall(job)
        yield from self._horovod_shut_down(job)
        yield from self._out_of_sync(job)
        if job.stacks.height:
            yield from self._in_backward(job)
        else:
            yield from self._backward_tracebacks(job)
        yield from self._counts_differ(job)

    def _finished_first(self, job: Job) -> Iterator[Finding]:
        """The fewer ranks said they finished ("training done after 10 batches") while the
        others then timed out or lost them in their next collective: the finished ones ran out
        of data first (no DDP Join to say so)."""
        if job.rows("inputs_exhausted"):
            return
        split = finished_and_waiting(job)
        if split is None:
            return
        done, waiting, lost = split
        if len(done) >= len(waiting):
            return
        first = next(iter(done.values()))
        yield self.finding(
            f"{rank_phrase(done).capitalize()} finished (`{excerpt(first['text'], 80)}`) while "
            f"{rank_phrase(waiting)} went on and then timed out or lost "
            f"{'it' if len(done) == 1 else 'them'} in their next collective: the ranks have different numbers of batches (uneven "
            "inputs), and the finished ones left first.",
            evidence=[evidence_of(first), evidence_of(lost[0])], ranks=sorted(done),
            confidence=0.55, ts=first_ts(lost),
            details={"exhausted": sorted(done), "waiting": sorted(waiting)})

    def _out_of_sync(self, job: Job) -> Iterator[Finding]:
        """fairseq's all_gather_list found the workers out of step ("requires all workers to
        enter the function together"): its message names the two reasons, a worker that ran
        out of memory (then the OOM is the cause: CRASH002) or one that finished its epoch
        while the others still iterated."""
        rows = job.rows("workers_out_of_sync")
        if not rows or job.rows("oom"):
            return
        yield self.from_rows(
            rows, "fairseq's all_gather_list found the workers out of step, and no worker ran "
            "out of memory: one worker finished its epoch while the others still iterated over "
            "their data (uneven inputs: shards or batches of different sizes per worker).",
            shown=1, ranks=[], confidence=0.6, details={"fairseq": "out_of_sync"})

    def _horovod_shut_down(self, job: Job) -> Iterator[Finding]:
        """Horovod refused a rank's next operation because it had shut down ("... caused by an
        exception on one of the ranks or an attempt to allreduce ... after one of the ranks
        finished execution") and no rank failed before that: with no exception to blame, one
        rank finished its loop while the others still reduced."""
        shut = job.rows("horovod_shut_down")
        if not shut:
            return
        first = shut[0]
        refused = {r["rank"] for r in shut}
        if any(r["rank"] not in refused for r in job.rows("mpi_process_exit")):
            return  # (mpirun names another rank as the first to fail: its own error)
        on_shut = {(r["source"], r["line"]) for r in shut}
        for row in job.rows(*kinds_tagged("failure")):
            if (row["source"], row["line"]) in on_shut:
                continue
            # (mpirun merges the ranks' output out of order: a rank Horovod did not refuse that
            # failed, wherever its lines landed, failed of its own)
            if (row["rank"] is not None and row["rank"] not in refused) \
                    or came_before(row, first):
                return
        yield self.from_rows(
            shut, "Horovod had shut down when a rank asked for its next allreduce, and no rank "
            "failed before that: Horovod's own message gives the other reason, a rank that "
            "finished execution while the others still reduced. The ranks have different "
            "numbers of batches (uneven inputs), or one left the loop early (an early-stopping or "
            "evaluation decision taken on one rank).", shown=2, ranks=[], confidence=0.7,
            details={"horovod": "shut_down"})

    def _ended_before_stall(self, job: Job) -> Iterator[Finding]:
        """Horovod's stall inspector names the ranks that never submitted the gradients the
        others wait to reduce, and, before it, as many end-of-training lines ("Loss for final
        step: ..." of TensorFlow's Estimator, on every worker when its train() returns) as there
        are such ranks, none of them from another rank: those ranks had finished training while
        the others were still in it."""
        missing = most_missing(horovod_missing(job))
        ends = job.rows("training_end")
        stall = job.rows("horovod_stall", "horovod_stalled_tensor")
        if not missing or not ends or not stall:
            return
        if any(e["rank"] is not None and e["rank"] not in missing for e in ends):
            return
        ranked = {e["rank"] for e in ends if e["rank"] is not None}
        if (ranked != missing if ranked else len(ends) != len(missing)):
            return
        if any((e["source"], e["line"]) > (s["source"], s["line"]) for e in ends for s in stall
               if e["source"] == s["source"]):
            return
        yield self.finding(
            f"{rank_phrase(missing).capitalize()} finished training (`{excerpt(ends[0]['text'], 60)}`"
            f"{f' ×{len(ends)}' if len(ends) > 1 else ''}) while the other ranks still trained and "
            f"waited for {'its' if len(missing) == 1 else 'their'} gradients (Horovod's stall "
            "inspector): the ranks have different numbers of steps (uneven inputs), and the ones "
            "with fewer left the loop first.",
            evidence=[evidence_of(ends[0]), evidence_of(stall[0])], ranks=sorted(missing),
            confidence=0.85, ts=first_ts(stall), details={"exhausted": sorted(missing)})

    def _left_for_evaluation(self, job: Job) -> Iterator[Finding]:
        """Logs only: ranks timed out at the same collective number with the same op but
        different sizes (a gradient bucket of millions of elements on some, a 1-element metric
        on others), and the ranks of the smaller one said they had started evaluating or
        validating: they ran out of training batches first and went on to their evaluation's
        collectives while the others still trained."""
        sized = split_sizes(job)
        if sized is None:
            return
        seq, op, sizes, rows = sized
        small = min(sizes.values())
        evaluating = {r for r in ((w["data"].get("rank", w["rank"])) for w in
                                  job.rows("rank_local_work")
                                  if EVALUATION.search(w["data"].get("what") or ""))
                      if r is not None and sizes.get(r) == small}
        big = {r for r, n in sizes.items() if n != small}
        if not evaluating or not big:
            return
        yield self.finding(
            f"{rank_phrase(evaluating).capitalize()} had left training for evaluation while "
            f"{rank_phrase(big)} still trained: at {op} #{seq} "
            f"{rank_phrase(big)} all-reduced {max(sizes.values())} elements (a gradient bucket) "
            f"and {rank_phrase(evaluating)} {small} (an evaluation metric), so the ranks have "
            "different numbers of training batches (uneven inputs) and the ones with fewer "
            "went on first.", evidence=[evidence_of(r) for r in rows[:3]],
            ranks=sorted(evaluating), confidence=0.75, ts=first_ts(rows),
            details={"sequence_number": seq, "numel": {str(k): v for k, v in sizes.items()}})

    def _join_exhausted(self, job: Job) -> Iterator[Finding]:
        """DDP's Join context said so itself (throw_on_early_termination=True), or a trainer
        that announces the worker whose epoch ended first (AllenNLP)."""
        rows = job.rows("inputs_exhausted")
        if not rows:
            return
        out = sorted({r["data"]["exhausted"] for r in rows if "exhausted" in r["data"]})
        if all("uneven" in r["data"] for r in rows):
            # The loop's own check: its barrier names the ranks that did not come back.
            out = sorted(barrier_named(job))
            who = rank_phrase(out) if out else "some ranks"
            yield self.from_rows(
                rows, "The training loop's own join check reported uneven workloads ('Detected "
                f"uneven workload distribution'): {who} had more batches than the others, which "
                "left the loop and waited.", shown=2, ranks=out, confidence=0.8,
                details={"exhausted": out})
            return
        who = rank_phrase(out).capitalize() if out else "At least one rank"
        said = ("its trainer said it finished its epoch first" if any(
            "completed its entire epoch" in r["text"] for r in rows)
            else "DDP's Join context stopped every rank")
        yield self.from_rows(
            rows, f"{who} ran out of inputs before the others ({said}): the ranks have different "
            "numbers of batches (uneven inputs).", shown=2,
            ranks=out, confidence=0.9, details={"exhausted": out})

    def _counts_differ(self, job: Job) -> Iterator[Finding]:
        """The ranks printed their own counts of batches, steps or samples ("Rank = 2, Number
        of batches 8" against 4 on the others), and the counts differ: every DDP rank must run
        the same number of steps. A count a rank printed with several values is a counter, not
        its data's size, and is left out. Named: the ranks off the majority's count, or, with
        no majority, those with the fewest (they leave the loop first)."""
        by_label: dict[str, dict[int, set[int]]] = {}
        rows_of: dict[str, list] = {}
        for r in job.rows("rank_data_count"):
            rank = r["data"].get("rank", r["rank"])
            label = str(r["data"].get("what", "")).lower()
            if rank is None or not label:
                continue
            by_label.setdefault(label, {}).setdefault(rank, set()).add(r["data"]["n"])
            rows_of.setdefault(label, []).append(r)
        for label, counts in sorted(by_label.items()):
            fixed = {rank: next(iter(ns)) for rank, ns in counts.items() if len(ns) == 1}
            if len(fixed) < 2 or len(fixed) < len(counts) or len(set(fixed.values())) < 2:
                continue
            tally = Counter(fixed.values())
            top, n_top = tally.most_common(1)[0]
            if n_top > len(fixed) / 2:
                odd = sorted(r for r, n in fixed.items() if n != top)
            else:
                odd = sorted(r for r, n in fixed.items() if n == min(fixed.values()))
            said = "; ".join(f"{rank_phrase(sorted(r for r, m in fixed.items() if m == n))}: "
                             f"{n}" for n in sorted(tally))
            rows = rows_of[label]
            yield self.finding(
                f"The ranks report different {label!r} ({said}): every rank of a DDP job must "
                "run the same number of steps, so the ranks with fewer leave the loop while "
                f"the others wait for them in a collective (uneven inputs); "
                f"{rank_phrase(odd)} {'is' if len(odd) == 1 else 'are'} the odd one"
                f"{'' if len(odd) == 1 else 's'}.",
                evidence=[evidence_of(r) for r in rows[:3]], ranks=odd, confidence=0.6,
                ts=first_ts(rows), details={"label": label, "counts": {
                    str(r): n for r, n in sorted(fixed.items())}})
            return

    def _backward_tracebacks(self, job: Job) -> Iterator[Finding]:
        """Logs only, the same as :meth:`_in_backward` by the ranks' last tracebacks: most
        timed out (or lost a peer) in ``loss.backward()``, DDP's gradient all-reduce, the
        others in a collective call after the loop (a final barrier, an evaluation
        all_reduce)."""
        back, other = backward_split(job)
        if not back or not other or len(other) > len(back):
            return
        calls = sorted({r["data"]["frame"]["func"] for r in other.values()})
        rows = [*other.values(), *back.values()]
        yield self.finding(
            f"{rank_phrase(other).capitalize()} left the training loop early: "
            f"{rank_phrase(back)} timed out in DDP's gradient all-reduce (in backward) while "
            f"{rank_phrase(other)} timed out in {', '.join(calls)}, as their last tracebacks "
            "show. The ranks ran different numbers of synchronizing steps: uneven inputs, or a "
            "per-rank setting that changes the step count (gradient accumulation, max steps).",
            evidence=[evidence_of(r) for r in rows[:3]], ranks=sorted(other), confidence=0.65,
            ts=first_ts(rows), details={"in_backward": sorted(back), "left_loop": sorted(other)})

    def _in_backward(self, job: Job) -> Iterator[Finding]:
        tree = job.stack_tree
        in_backward = [c for c in tree.classes if c.collective and is_backward_wait(c.collective)]
        if not in_backward:
            return
        elsewhere = [c for c in tree.classes
                     if c.collective is not None and not is_backward_wait(c.collective)]
        gone = self._exited_ranks(job, tree)
        n_back = sum(c.size for c in in_backward)
        n_else = sum(c.size for c in elsewhere) + len(gone)
        if not n_else or n_else > n_back:
            return
        if snapshots.moved(job.snapshot_moves, tree.procs):
            return  # a collective completed between stack snapshots: ranks only passing by
        procs = [p for c in elsewhere for p in tree.members(c.members)]
        ranks = [p.rank for p in procs] + sorted(gone)
        parts = []
        for c in elsewhere:
            f = c.collective
            where = f" (called from {c.user_frame.func}, {c.user_frame.file}:{c.user_frame.line})" \
                if c.user_frame else ""
            parts.append(f"{stacktree.who(tree.members(c.members))} waits in "
                         f"{f.func if f else '?'}{where}")
        if gone:
            parts.append(f"{rank_phrase(gone)} exited")
        waiting = stacktree.who([p for c in in_backward for p in tree.members(c.members)])
        who = rank_phrase([r for r in ranks if r is not None]) if None not in ranks \
            else stacktree.who(procs)
        evidence = []
        for c in [*elsewhere[:2], in_backward[0]]:
            p = tree.members(c.members)[0]
            evidence.append(Evidence(path=p.source, line=None, rank=p.rank, host=p.host,
                                     text=f"{p.label} (pid {p.pid}): {c.collective}"))
        yield self.finding(
            f"{who[0].upper()}{who[1:]} left the training loop early: {waiting} wait in DDP's "
            f"gradient all-reduce (backward) while {'; '.join(parts)}. The ranks ran different "
            "numbers of steps (uneven inputs).",
            evidence=evidence, ranks=ranks, hosts=[p.host for p in procs], confidence=0.8,
            details={"in_backward": n_back, "left_loop": sorted(r for r in ranks if r is not None)},
        )

    @staticmethod
    def _exited_ranks(job: Job, tree: stacktree.StackTree) -> set[int]:
        """Workers the bundle listed as exited, while their peers are still dumped."""
        if not job.processes.height:
            return set()
        exited = job.processes.filter(
            (pl.col("role") == "worker") & (pl.col("stack_status") == "exited")
            & pl.col("rank").is_not_null()
        )
        dumped = {p.rank for p in tree.procs}
        return {int(r) for r in exited["rank"].to_list()} - dumped


#: What a rank-local-work line says that means evaluation rather than a checkpoint.
EVALUATION = re.compile(r"(?i)^(?:evaluat|validat|predict)")


def split_sizes(job: Job) -> tuple[int, str, dict[int, int], list] | None:
    """(seq, op, rank -> NumelIn, rows) when watchdog timeouts put ranks at one collective
    number with one op but different sizes, else None."""
    for seq, timed in sorted(timeouts_by_seq(job).items()):
        sized = [(rank, r) for rank, r in timed
                 if r["data"].get("nin") is not None and r["data"].get("op")]
        ops = {r["data"]["op"] for _, r in sized}
        sizes = {rank: r["data"]["nin"] for rank, r in sized}
        if len(ops) == 1 and len(set(sizes.values())) > 1:
            return seq, ops.pop(), sizes, [r for _, r in sized]
    return None
