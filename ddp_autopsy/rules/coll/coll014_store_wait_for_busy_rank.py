"""A rank gave up waiting in the store for a rank that was alive but busy elsewhere.

## What it detects
A store read of a running job timed out, and the inputs say whom it waited for or that someone
was still working:
- the NCCL communicator's set-up (torch 2.0+): "[1] is setting up NCCL communicator and
  retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got
  error: wait timeout after 1800000ms". The root rank publishes that id when it enters its first
  collective of the group: the waiting rank got there, the root did not, and it did not crash;
- a bare store timeout ("wait timeout after ...ms", c10d's "waitForInput: socket ... timed out
  after ...ms") while a progress bar that is not the waiting ranks' own was still running
  ("Tokenizing Prompts:  92%|...| 328986/359152 [29:58<12:05, ...]"): that process was working
  when the others gave up;
- a rank's timeout (or its traceback, cut) in the barrier of a block rank 0 runs first
  (transformers' / accelerate's `main_process_first`, YOLO's `torch_distributed_zero_first`): it
  waited for rank 0, which had not finished the block's work;
- a traceback glued to a progress bar still running whose elapsed time is just past one of
  torch's default process-group timeouts (10 or 30 minutes: "Running tokenizer on dataset: 47%|
  ...| [30:09<33:25, ...]Traceback (most recent call last):"), at a low confidence.

## Why it hangs or kills the job
The first collective (often the `barrier()` of `main_process_first`, or the first DDP broadcast)
waits for every rank. Work that only one rank does before it (tokenizing or caching a dataset,
downloading or converting a checkpoint) and that lasts longer than the process group's timeout
(30 minutes by default) makes the waiting ranks' store read time out, though nothing is broken.

## Evidence
The store timeout line (with the root rank it waited for, when named) and the busy rank's last
line (its progress bar).

## Remedy
Do long single-process work before `init_process_group`, or once, offline, and load its cached
result; or raise the timeout (`init_process_group(timeout=...)`, the HF Trainer's `ddp_timeout`,
accelerate's `InitProcessGroupKwargs(timeout=...)`) to cover it.

## Example
```
Tokenizing Prompts (num_proc=64):  92%|█████████▏| 328986/359152 [29:58<12:05, 41.59 examples/s]
[rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) timed out after 1800000ms
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.lines import is_progress
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, excerpt, first_ts, rank_phrase
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE, LOST_STORE


def waiting_rank(row: dict[str, Any]) -> int | None:
    """The rank that timed out: its prefix, else the ``[N] is setting up`` of the message."""
    return row["rank"] if row["rank"] is not None else row["data"].get("rank")


def busy_waits(job: Job) -> tuple[list[dict[str, Any]], int | None, dict[str, Any] | None]:
    """The store timeouts that waited for a live rank, the rank waited for (None when unknown)
    and that rank's last line when it was a running progress bar; ``([], None, None)`` when the
    inputs do not show one. RDZV004 leaves these waits alone: the rank waited for had joined."""
    waits = job.rows("store_wait_timeout")
    if not waits:
        return [], None, None
    crashed = set(job.crashes.ranks)
    waiting = {w for w in map(waiting_rank, waits) if w is not None}
    # A store that reset or closed the connection went away with its host (a crash): only a
    # read that timed out, or whose error was cut off, waited for a live rank.
    waits = [r for r in waits if not LOST_STORE.search(r["data"].get("err") or "")]
    roots = {r["data"]["root"] for r in waits if r["data"].get("root") is not None}
    bars = [r for r in job.rows("last_line")
            if r["data"].get("progress") and r["rank"] not in waiting and "100%|" not in r["text"]
            and is_progress(r["text"])]
    if len(roots) == 1:
        root = next(iter(roots))
        if root in crashed or root in waiting:
            return [], None, None
        bar = next((b for b in bars if b["rank"] in (root, None)), None)
        return [r for r in waits if r["data"].get("root") == root], root, bar
    if roots or not bars or not waiting:
        return [], None, None
    bar = bars[-1]
    return waits, bar["rank"], bar


class StoreWaitForBusyRank(Rule):
    code = "COLL014"
    slug = "store-wait-for-busy-rank"
    cause = "rank_stuck_outside_collective"
    optional = ("crashes",)

    def check(self, job: Job) -> Iterator[Finding]:
        waits, busy, bar = busy_waits(job)
        if not waits:
            found = list(self._rank_zero_first(job))
            yield from found or self._bar_past_timeout(job)
            return
        waiting = {w for w in map(waiting_rank, waits) if w is not None}
        # A bar without a rank prefix, beside waiting ranks that have one: another process.
        # Which one is not written; rank 0 does the work the others wait for under
        # main_process_first and publishes NCCL's id, so it is named as the likely one.
        suspect = busy if busy is not None else 0
        inferred = busy is None
        root = waits[0]["data"].get("root") is not None
        who = rank_phrase(waiting, empty="a rank")
        summary = (f"{who[0].upper()}{who[1:]} gave up waiting in the store for rank {suspect}"
                   + (", which never reached its first collective (it publishes NCCL's "
                      "communicator id there) and did not crash" if root else "")
                   + (f"; a progress bar was still running (`{excerpt(bar['text'], 100)}`)"
                      + (f", most likely rank {suspect}'s: it is not the waiting ranks' own"
                         if inferred else "") if bar else "")
                   + ": rank-local work took longer than the process group's timeout.")
        evidence = [evidence_of(waits[0])] + ([evidence_of(bar)] if bar else [])
        yield self.finding(
            summary, evidence=evidence, ranks=(suspect,),
            confidence=0.45 if inferred else 0.7, ts=first_ts(waits),
            details={"waiting_ranks": sorted(waiting), "waited_for": suspect,
                     "inferred": inferred, "progress": bar["text"] if bar else None})

    def _rank_zero_first(self, job: Job) -> Iterator[Finding]:
        """A rank's timeout (or its traceback, cut) in the barrier of a "rank 0 goes first"
        block (transformers' and accelerate's `main_process_first`, YOLO's
        `torch_distributed_zero_first`): it waited for rank 0 to finish the block's work alone
        (tokenizing, downloading, caching a dataset), and rank 0 had not, within the timeout."""
        rows = [r for r in job.rows("exception", "traceback_fragment")
                if ZERO_FIRST & {*(r["data"].get("callers") or []),
                                 (r["data"].get("frame") or {}).get("func")}
                and (r["kind"] == "traceback_fragment" or CONSEQUENCE.search(r["text"]))]
        waiting = {r["rank"] for r in rows if r["rank"] is not None}
        if not rows or 0 in waiting or 0 in job.crashes.ranks:
            return
        funcs = sorted(ZERO_FIRST & {f for r in rows for f in r["data"].get("callers") or []})
        who = rank_phrase(waiting, empty="a rank")
        yield self.finding(
            f"{who[0].upper()}{who[1:]} gave up in the barrier of a block rank 0 runs first "
            f"({', '.join(funcs) or 'main_process_first'}): rank 0's work in it (tokenizing, "
            "downloading, caching a dataset) took longer than the process group's timeout.",
            evidence=[evidence_of(r) for r in rows[:2]], ranks=(0,), confidence=0.5,
            ts=first_ts(rows), details={"waiting_ranks": sorted(waiting), "waited_for": 0,
                                        "inferred": True, "blocks": funcs})


    def _bar_past_timeout(self, job: Job) -> Iterator[Finding]:
        """A traceback (cut, or a timeout's) glued to a progress bar still running, whose
        elapsed time is just past one of torch's default process-group timeouts (10 or 30
        minutes): the others gave up waiting while that process was still at work."""
        for r in job.rows("traceback_fragment", "exception"):
            bar = r["data"].get("after_bar")
            if not bar or "100%|" in bar or (r["kind"] == "exception"
                                             and not CONSEQUENCE.search(r["text"])):
                continue
            m = ELAPSED.search(bar)
            if not m:
                continue
            elapsed = int(m["h"] or 0) * 3600 + int(m["m"]) * 60 + int(m["s"])
            if not any(t <= elapsed <= t + TIMEOUT_SLACK_S for t in DEFAULT_TIMEOUTS_S):
                continue
            yield self.finding(
                f"A traceback cut in at {m.group(0)[1:-1]} into a progress bar still running "
                f"(`{excerpt(bar, 100)}`), just past one of torch's default process-group "
                "timeouts: the other ranks most likely gave up waiting while that process was "
                "still at work, rank 0 as a rule (a `main_process_first` block).",
                evidence=[evidence_of(r)], ranks=(0,), confidence=0.4, ts=r["ts"],
                details={"waited_for": 0, "inferred": True, "progress": bar,
                         "elapsed_s": elapsed})
            return


#: tqdm's elapsed time: "[30:09<33:25, ..." or "[1:02:03<...".
ELAPSED = re.compile(r"\[(?:(?P<h>\d+):)?(?P<m>\d\d):(?P<s>\d\d)<")
#: torch's default process-group timeouts (NCCL's 10 minutes in some releases, 30 otherwise),
#: and how long after one the failure may be printed.
DEFAULT_TIMEOUTS_S = (600, 1800)
TIMEOUT_SLACK_S = 300


#: Context managers that let rank 0 (or each node's local rank 0) run a block before the others,
#: which wait in a barrier meanwhile.
ZERO_FIRST = frozenset({"main_process_first", "local_main_process_first",
                        "torch_distributed_zero_first", "distributed_zero_first",
                        "rank_zero_first", "zero_rank_first", "main_process_first_ctx"})
