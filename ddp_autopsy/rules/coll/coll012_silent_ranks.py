"""Logs only: the ranks that did not time out are the ones the others waited for.

## What it detects
With no stack dumps and no Flight Recorder: some ranks report a collective timeout (the NCCL
watchdog, Gloo, a monitored barrier) while other ranks of the job — within the world size the
inputs state, or below the highest rank seen — report none and did not crash. The silent ranks
are the suspects; the rule quotes the last line each of them printed (a progress bar, "Saving
checkpoint", evaluation, tokenizing...). A monitored barrier says it outright: its root names the
ranks that never arrived ("Ranks 2 failed to pass monitoredBarrier"), or the others report that
the root itself never answered ("Rank 3 successfully reached monitoredBarrier, but received
errors while waiting for send/recv from rank 0").
ProcessGroupNCCL's heartbeat monitor ("watchdog got stuck for N seconds", "Heartbeat monitor
timed out!") with no collective timeout from any rank names the ranks that printed it: wedged
themselves (a CUDA or NCCL call that never returned, a thread holding the GIL).
Among several silent ranks none of which left a line, rank 0 alone is named when the timeout is
in a broadcast (rank 0 is the usual source) or in one of the job's first five collectives (rank
0 alone preparing data or a model while the others wait in a set-up barrier).
With no timeout at all: the scheduler's time limit stopped a job in which nothing failed while
most ranks' last lines are alike ("RANK 7: running step 1/10") and a few ranks' are not; those
few are named, at a low confidence (a job that runs out its time limit is most often hung).

## Why it hangs or kills the job
A collective completes only when every rank enters it. The ranks that timed out were waiting for
the ones that never arrived: those were busy elsewhere (rank-local work, a slow data loader, a
dead-locked thread) and print no timeout because they never entered the collective.

When the inputs are a fragment (most of the world silent), the timeout still says that some rank
never reached the collective (not when it is the group's very first collective and no other rank
left any line nor any rank a line of work or progress: a first collective that never completes
is as often a transport that cannot move data between the GPUs): that is reported with no
culprit and a low confidence.

## Evidence
The timeout lines (which ranks, which collective and sequence number) and the silent ranks' last
lines.

## Remedy
Look at what the silent ranks were doing (their last lines; a stack dump of the hung job with
`ddp-autopsy collect` shows it exactly). Make rank-local work collective-free or shared (run
evaluation on every rank, put a barrier with a long enough timeout after rank-0-only work), fix
the blocking data loader or I/O, and raise the timeout (`init_process_group(timeout=...)`) only
if the work is legitimately long.

## Example
```
[rank0]:Map:  41%|████      | 4100/10000 [02:10<03:07, 31.4 ex/s]
[rank1]:[E1122 10:31:02.120000000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.
[rank2]:[E1122 10:31:02.121000000 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.
[rank3]:[E1122 10:31:02.122000000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600044 milliseconds before timing out.
```
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.lines import parse_line
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.analyzer.stackview import BACKWARD_WAITS, COLLECTIVES
from ddp_autopsy.rules.base import (
    Evidence,
    Finding,
    Rule,
    evidence_of,
    excerpt,
    first_ts,
    parse_ranks,
    rank_phrase,
)
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE

REPORTING = kinds_tagged("lost_peer") + kinds_tagged("hang")


#: Collectives up to this sequence number are a job's first (its set-up barriers).
EARLY_SEQ = 5


class SilentRanks(Rule):
    code = "COLL012"
    slug = "silent-ranks"
    cause = "rank_stuck_outside_collective"
    optional = ("collective_report", "crashes", "rank_state")

    def check(self, job: Job) -> Iterator[Finding]:
        if job.stacks.height or job.fr_dumps.height:
            return  # the stacks (COLL002) and the dumps (COLL005) say it better
        events = job.active_events
        barrier = list(self._barrier_root(job))
        if barrier or barrier_named(job):
            # (named ranks and no finding: the ranks the barrier named are the ones that crashed)
            yield from barrier
            return
        reported = events.filter(pl.col("kind").is_in(REPORTING))
        if reported.height == 0:
            yield from self._behind_at_time_limit(job, events)
        waiting = set(reported["rank"].drop_nulls().to_list())
        if waiting:  # (and those whose counters show they issued it: a dump signal's report)
            waiting |= {r for g in job.collective_report.groups for r in g.waiting}
        timed_out = reported.filter(pl.col("kind").is_in(kinds_tagged("hang")))
        if timed_out.height == 0:
            yield from self._watchdog_stuck(job)
        seen = set(events["rank"].drop_nulls().to_list())
        if not waiting:
            # The watchdog's abort stack says "timeout" only through its checkTimeout frame
            # (the same abort follows an asynchronous NCCL error, without that frame).
            timed_out = pl.concat([timed_out, events.filter(
                (pl.col("kind") == "watchdog_abort") & pl.col("text").str.contains("checkTimeout")
            )], how="diagonal_relaxed")
            if timed_out.height and not seen and not job.crashes.ranks \
                    and not _first_call_alone(job, events, timed_out, set()):
                yield from self._rankless(job, job.decoded_rows(timed_out))
            return
        if timed_out.height == 0:
            return
        # (a rank whose lines are a traceback cut short failed there too: not elsewhere)
        cut = set(events.filter(pl.col("kind") == "traceback_fragment")["rank"].drop_nulls()
                  .to_list())
        if _first_call_alone(job, events, timed_out, seen - waiting - cut):
            return
        world = job.world_size or (max(seen) + 1 if seen else None)
        if not world or world < 2:
            # Only the waiting rank is in the inputs: some other rank never came, unnamed.
            if not job.crashes.ranks and not _own_crashes(job):
                timeouts = job.decoded_rows(timed_out)
                yield self.finding(
                    f"{rank_phrase(waiting).capitalize()} timed out waiting in "
                    f"{_collective(job, timeouts)}: some other rank never reached it, and the "
                    "inputs hold nothing from the other ranks.",
                    evidence=[evidence_of(timeouts[0])], ranks=(), confidence=0.3,
                    ts=first_ts(timeouts), details={"waiting_ranks": sorted(waiting)})
            return
        silent = set(range(world)) - waiting - set(job.crashes.ranks)
        if _own_crashes(job):
            # A rank failed by itself: the ranks its launcher then stopped were torn down
            # because of it, not silent (CRASH001 tells that story).
            silent -= set(job.crashes.stopped)
            if not silent:
                return
        timeouts = job.decoded_rows(timed_out)
        if not silent:
            return  # every rank waited: in different collectives, COLL011 says which
        last = _last_lines(events, silent)
        # (a rank whose lines include a failure, or whose last line is the distributed
        # runtime's own, its watchdog's teardown say, is no rank seen at other work: its
        # timeout was cut from the paste)
        failing = set(events.filter(pl.col("kind").is_in(list(kinds_tagged("failure"))))[
            "rank"].drop_nulls().to_list())
        talking = {r for r, row in last.items()
                   if r not in failing and not RUNTIME_LINE.search(row["text"])}
        # (most ranks silent with lines of their own: the one whose last line is unlike the
        # others' goes first)
        many = len(silent) > max(1, world // 2)
        odd = _odd_last_line(events, silent, waiting) if many else None
        if len(silent - talking) > max(1, world // 2) or odd is not None:
            # Most ranks silent, or seen failing only: the logs are a fragment. A timeout still
            # means some rank never reached the collective. One rank whose last line is unlike
            # all the others' is the suspect; else rank 0: it exists in every job, and
            # rank-0-only work is the usual reason one rank is elsewhere: when it is not among
            # those that waited, it is the first suspect (named as such, at a low confidence).
            summary = (f"{rank_phrase(waiting).capitalize()} timed out waiting in "
                       f"{_collective(job, timeouts)}: some other rank never reached it")
            if odd is not None:
                rank, row = odd
                summary += (f". Rank {rank}'s last line is unlike the other ranks' last lines "
                            f"(`{excerpt(row['text'], 120)}`): it was doing something else "
                            "when they stopped, so look at it first")
                yield self.finding(
                    summary + ".", evidence=[evidence_of(row), evidence_of(timeouts[0])],
                    ranks=(rank,), confidence=0.35, ts=first_ts(timeouts),
                    details={"waiting_ranks": sorted(waiting), "suspect": rank})
                return
            summary += ", and the inputs hold nothing from the ranks it waited for"
            suspect = 0 in silent
            if suspect:
                summary += (". Rank 0 is not among the ranks that timed out: rank-0-only work "
                            "(evaluation, checkpointing, logging, data preparation) is the most "
                            "common reason, so look at what rank 0 was doing first")
            yield self.finding(
                summary + ".", evidence=[evidence_of(timeouts[0])],
                ranks=(0,) if suspect else (), confidence=0.3, ts=first_ts(timeouts),
                details={"waiting_ranks": sorted(waiting), "suspect": 0 if suspect else None})
            return
        # Silent ranks whose last line shows them at work (a progress bar, rank-local work) beside
        # silent ranks the inputs hold no line of at all: the working ones are the story; the
        # others are only absent from the paste.
        working = {r for r, row in last.items()
                   if json.loads(row["data"] or "{}").get("progress")} | (
            {r for r in (w["data"].get("rank", w["rank"]) for w in job.rows("rank_local_work"))
             if r in silent})
        unseen = silent - set(last)
        if working and unseen:
            silent = working
            last = {r: row for r, row in last.items() if r in working}
        op = _collective(job, timeouts)
        # A broadcast waits for its source, and rank 0 is the source of nearly every one (DDP's
        # initial weights, broadcast_object_list, a framework's decisions): among several silent
        # ranks with nothing else to tell them apart, rank 0 is the one the others wait for.
        # So is it at the job's first few collectives (a barrier while rank 0 alone prepares
        # the data: main_process_first, torch_distributed_zero_first, a dataset cache).
        root = None
        seqs = {t["data"].get("seq") for t in timeouts}
        early = bool(seqs) and None not in seqs and max(seqs) <= EARLY_SEQ
        if not working and len(silent) > 1 and 0 in silent and not last.keys() - {0} \
                and ({t["data"].get("op") for t in timeouts} == {"BROADCAST"} or early):
            root, unseen, silent = 0, silent - {0}, {0}
        who = rank_phrase(silent)
        doing = "; ".join(f"rank {r}'s last line: `{excerpt(last[r]['text'], 120)}`"
                          for r in sorted(last)[:3])
        # a progress bar the timeout was glued to, which names no rank: what some process was
        # doing when the others gave up (said as it is, not claimed for a rank)
        bar = next((t["data"]["after_bar"] for t in timeouts if t["data"].get("after_bar")), None)
        summary = (f"{who[0].upper()}{who[1:]} never reached {op} that "
                   f"{rank_phrase(waiting)} timed out in"
                   + (f" ({doing})" if doing else f"; no line from {who} says what it was doing"
                      + (f" (the progress bar the timeout was printed after, which names no "
                         f"rank: `{excerpt(bar, 100)}`)" if bar else ""))
                   + (f"; {rank_phrase(unseen)} left no line in the inputs" if working and unseen
                      else "")
                   + (f" (rank 0 is the usual source of a broadcast; {rank_phrase(unseen)} "
                      "left no line in the inputs)" if root == 0 and not early else "")
                   + (f" (at collective #{max(seqs)}, one of the job's first: rank 0 alone "
                      "preparing data or a model while the others wait is the usual reason; "
                      f"{rank_phrase(unseen)} left no line in the inputs)" if root == 0 and early
                      else "") + ".")
        evidence: list[Evidence] = [evidence_of(last[r]) for r in sorted(last)[:2]]
        evidence.append(evidence_of(timeouts[0]))
        seen_silent = silent & seen
        yield self.finding(
            summary, evidence=evidence, ranks=silent,
            hosts=[r.get("host") for r in last.values()],
            # Below the rules that say why (COLL009's counters, COLL010's rank-local work).
            confidence=0.5 if seen_silent else 0.4, ts=first_ts(timeouts),
            details={"waiting_ranks": sorted(waiting), "world_size": world,
                     "last_lines": {str(r): row["text"] for r, row in sorted(last.items())}},
        )


    def _watchdog_stuck(self, job: Job) -> Iterator[Finding]:
        """ProcessGroupNCCL's heartbeat monitor fired ("watchdog got stuck for 480 seconds
        without making progress", "Heartbeat monitor timed out!") and no rank reported a
        collective timeout: the ranks that printed it were wedged themselves (a CUDA or NCCL
        call that never returned, a thread holding the GIL), so not even their watchdog ran. Not
        when it came after the program's exit began ("destroy_process_group() was not called
        before program exit"): the teardown hung, after the work was done."""
        # (not after its process group's destructor said the program was exiting: a hang of
        # the teardown, once the work was done)
        exiting = {(r["source"], r["rank"]): r["line"] for r in job.rows("pg_not_destroyed")}
        rows = [r for r in job.rows("watchdog_hang") if r["rank"] is not None
                and not exiting.get((r["source"], r["rank"]), r["line"]) < r["line"]]
        ranks = sorted({r["rank"] for r in rows})
        if not rows or job.crashes.ranks:
            return
        secs = next((r["data"]["seconds"] for r in rows if r["data"].get("seconds")), None)
        yield self.from_rows(
            rows, f"{rank_phrase(ranks).capitalize()} {'was' if len(ranks) == 1 else 'were'} "
            "wedged: ProcessGroupNCCL's watchdog "
            + (f"made no progress for {secs} seconds" if secs else "stopped making progress")
            + ", and no rank reported a collective timeout. A CUDA or NCCL call that never "
            "returned, or a thread holding the GIL, stops the watchdog itself; a rank that "
            "left the others' sequence of collectives (after an exception it caught, say) and "
            "waits in a call they never make does too. Its stack (`ddp-autopsy collect`, "
            "py-spy dump --native) shows where.", shown=2, ranks=ranks, confidence=0.35,
            details={"seconds": secs})

    def _behind_at_time_limit(self, job: Job, events: pl.DataFrame) -> Iterator[Finding]:
        """The scheduler's time limit stopped a job in which nothing failed, and most ranks'
        last lines are alike ("RANK 7: running step 1/10", numbers aside) while a few ranks'
        are not: a job that runs out its time limit is most often hung, and those few ranks
        are where (the rest had moved on to the next step). A rank whose last line is the
        scheduler's own cancellation printed nothing else there."""
        limit = [r for r in job.rows("external_signal")
                 if "TIME LIMIT" in str(r["data"].get("reason", ""))]
        if not limit or job.rows(*(set(kinds_tagged("failure")) - {"external_signal"})):
            return
        ranks = set(events["rank"].drop_nulls().unique().to_list())
        last = _last_lines(events, ranks)
        if len(last) < 4:
            return
        cancelled = {(r["source"], r["line"]) for r in limit}
        shape = {r: None if (row["source"], row["line"]) in cancelled else
                 re.sub(r"\d+", "#", parse_line(row["text"], 2000).body.strip())
                 for r, row in last.items()}
        counts = Counter(v for v in shape.values() if v is not None)
        if not counts:
            return
        usual, n = counts.most_common(1)[0]
        # (behind: its last line came before every usual one's, in one file or by the clock;
        # a rank whose last line is the cancellation itself says nothing either way)
        usual_rows = [row for r, row in last.items() if shape[r] == usual]
        others = [r for r, v in shape.items() if v is not None and v != usual]
        behind = sorted(r for r in others if all(_before(last[r], row) for row in usual_rows))
        if not behind or len(behind) != len(others) or n < 3 \
                or len(behind) > max(1, len(last) // 4):
            return
        example = next(row for r, row in last.items() if shape[r] == usual)
        yield self.from_rows(
            [*limit[:1], *(last[r] for r in behind[:2])],
            f"The scheduler's time limit stopped a job in which nothing failed, while "
            f"{rank_phrase(behind)} {'was' if len(behind) == 1 else 'were'} behind the others: "
            f"{n} ranks' last lines read like "
            f"`{excerpt(SRUN_LABEL.sub('', parse_line(example['text'], 2000).body), 80)}`, and "
            f"{rank_phrase(behind)}'s did not. A job that runs out its time limit is most often "
            "hung: look at what those ranks were doing.", shown=3, ranks=behind,
            confidence=0.4, details={"behind": behind, "usual_last_line": example["text"][:200]})

    def _barrier_root(self, job: Job) -> Iterator[Finding]:
        """A monitored barrier (``dist.monitored_barrier``, or TORCH_DISTRIBUTED_DEBUG=DETAIL's
        check before each collective) that some ranks of the group never reached: its root
        names them ("Ranks 2 failed to pass monitoredBarrier in 30000 ms"), or the ones that did
        ("... Successfully processed ranks: 1, 3"); the others say the root never answered
        ("Rank 3 successfully reached monitoredBarrier, but received errors while waiting for
        send/recv from rank 0"), and then, with no report of the root's own, the root is the
        one elsewhere (unless a crash the inputs show without its rank is the root's: then
        CRASH001's). These ranks were in the group: they joined, and were busy or stuck."""
        failed = job.rows("monitored_barrier_failed")
        timeouts = [r for r in job.rows("monitored_barrier_timeout") if "processed" in r["data"]]
        peers = job.rows("monitored_barrier_peer_error")
        culprits = barrier_named(job)
        world = job.world_size
        for r in timeouts if world else []:
            culprits |= set(range(world)) - parse_ranks(r["data"]["processed"]) - {r["data"]["by"]}
        named = bool(culprits)
        if not culprits:
            culprits = {r["data"]["peer"] for r in peers}
            if _unranked_crash(job):
                return  # the root's errors are a crash the inputs show: CRASH001's
        culprits -= set(job.crashes.ranks)
        if not culprits:
            return
        waiting = sorted({r["data"]["by"] for r in peers} | {r["data"]["by"] for r in timeouts
                                                              if r["data"].get("by") is not None})
        who = rank_phrase(culprits)
        how = ("the barrier's root reported that it never arrived" if named else
               "it is the barrier's root, and never answered")
        yield self.from_rows(
            [*failed[:1], *timeouts[:1], *peers[:2]],
            f"{who[0].upper()}{who[1:]} never reached the monitored barrier"
            + (f" that {rank_phrase(waiting)} reached" if waiting else "") + f": {how}.",
            shown=3, ranks=culprits, confidence=0.6 if named else 0.55,
            details={"waiting_ranks": waiting})

    def _rankless(self, job: Job, timeouts: list[dict[str, Any]]) -> Iterator[Finding]:
        """A timeout in a fragment that names no rank at all (the watchdog's C++ frames, a
        store wait): some rank never reached the collective, and rank-0-only work is the most
        common reason. Named as a suspicion, below any rule that reads a cause."""
        op = _collective(job, timeouts)
        yield self.finding(
            f"A collective timed out{'' if op == 'the collective' else f' ({op})'}, and the "
            "inputs name no "
            "rank: some rank never reached it. Rank-0-only work (evaluation, checkpointing, "
            "logging, data preparation) is the most common reason, so look at what rank 0 was "
            "doing first.",
            evidence=[evidence_of(timeouts[0])], ranks=(0,), confidence=0.25,
            ts=first_ts(timeouts), details={"waiting_ranks": [], "suspect": 0})


#: The module whose functions are the torch.distributed collectives a traceback ends in.
C10D_FILE = "torch/distributed/distributed_c10d.py"
#: DDP's own collective calls outside it: its buffer and state broadcasts
#: (``_distributed_broadcast_coalesced``, in every forward with ``broadcast_buffers=True``).
DDP_COLLECTIVES = {("torch/nn/parallel/distributed.py", "_distributed_broadcast_coalesced"),
                   ("torch/distributed/utils.py", "_sync_module_states"),
                   ("torch/distributed/utils.py", "_sync_params_and_buffers")}


#: srun --label's task number before a line ("12: ...").
SRUN_LABEL = re.compile(r"^\s*\d+: ")


def _odd_last_line(events: pl.DataFrame, silent: set[int],
                   waiting: set[int]) -> tuple[int, dict[str, Any]] | None:
    """The one silent rank whose last line, numbers aside, is unlike every other rank's last
    line, while those (two at least) are alike: the rank that was elsewhere."""
    last = _last_lines(events, silent | waiting)
    if len(last) < 3:
        return None
    # the message without its prefixes (a stamp's year does not matter here), numbers masked
    shape = {r: re.sub(r"\d+", "#", parse_line(row["text"], 2000).body.strip())
             for r, row in last.items()}
    counts = Counter(shape.values())
    odd = [r for r, sh in shape.items() if counts[sh] == 1]
    if len(odd) != 1 or odd[0] not in silent or len(counts) != 2 \
            or RUNTIME_LINE.search(last[odd[0]]["text"]):
        return None
    return odd[0], last[odd[0]]


def barrier_named(job: Job) -> set[int]:
    """The ranks a monitored barrier's root named as not arriving ("Ranks 2, 5 failed to pass
    monitoredBarrier in 30000 ms")."""
    return set().union(*(parse_ranks(r["data"].get("ranks"))
                         for r in job.rows("monitored_barrier_failed")))


def _own_crashes(job: Job) -> set[int]:
    """Ranks that failed by themselves: an exception that reports no other rank's failure, an
    out-of-memory error, or an exit the launcher reports for a rank that raised nothing else."""
    own: set[int] = {r["rank"] for r in job.rows("oom") if r["rank"] is not None}
    reported: set[int] = set()
    for row in job.rows("exception"):
        if row["rank"] is None or job.crashes.survived_row(row):
            continue
        if CONSEQUENCE.search(row["text"]):
            reported.add(row["rank"])
        else:
            own.add(row["rank"])
    for d in job.decoded_rows(job.crashes.events.filter(pl.col("kind") == "elastic_failure")):
        rank, code = d["data"].get("rank"), d["data"].get("exitcode")
        if isinstance(rank, int) and code not in (None, 0) and rank not in reported:
            own.add(rank)
    return own


def collective_frames(job: Job) -> dict[int, dict[str, Any]]:
    """Per rank, its last exception whose traceback ends in a torch.distributed collective (a
    timeout or a lost peer: the call it was blocked in)."""
    def in_collective(row: dict[str, Any]) -> bool:
        frame = row["data"].get("frame") or {}
        file = str(frame.get("file", ""))
        ddp = any(file.endswith(f) and frame.get("func") == fn for f, fn in DDP_COLLECTIVES)
        return bool(frame.get("func")) and (file.endswith(C10D_FILE) or ddp)

    return _last_by_rank(r for r in job.rows("exception") if in_collective(r))


def _last_by_rank(rows: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per rank, the last of ``rows`` (by file and line); rows naming no rank left out."""
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row["rank"] is None:
            continue
        prev = out.get(row["rank"])
        if prev is None or (row["source"], row["line"]) >= (prev["source"], prev["line"]):
            out[row["rank"]] = row
    return out


#: A line of the distributed runtime itself (ProcessGroupNCCL/Gloo, the store, NCCL), not of
#: the program, or the opening of a traceback (cut there): it says nothing of what the
#: program was doing.
RUNTIME_LINE = re.compile(
    r"ProcessGroup\w*\.[ch]pp|NCCL (?:INFO|WARN)|TCPStore|\[c10d\]|Traceback \(")


def _last_lines(events: pl.DataFrame, ranks: set[int]) -> dict[int, dict[str, Any]]:
    """Each rank's last line as the line reader recorded it (the latest when it has several:
    by the clock, else the later line of one file)."""
    rows = events.filter((pl.col("kind") == "last_line") & pl.col("rank").is_in(list(ranks)))
    out: dict[int, dict[str, Any]] = {}
    for row in rows.iter_rows(named=True):
        prev = out.get(row["rank"])
        if prev is None or _before(prev, row):
            out[row["rank"]] = row
    return out


def _before(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether line ``a`` was written before line ``b``: by the clock when both have one, else
    by the line numbers of one file (lines of two files without clocks: not known, False)."""
    if a["ts"] is not None and b["ts"] is not None:
        return a["ts"] < b["ts"]
    return a["source"] == b["source"] and a["line"] < b["line"]


def _collective(job: Job, timeouts: list[dict[str, Any]]) -> str:
    """``collective ALLREDUCE #12`` from the report or the timeout lines, else ``the
    collective``."""
    for g in job.collective_report.groups:
        if g.stuck_at is not None:
            ops = sorted({s.timed_out_op for s in g.ranks.values() if s.timed_out_op})
            return f"collective {'/'.join(ops) + ' ' if ops else ''}#{g.stuck_at}"
    # Gloo names its transport operation (send, recv); the traceback names the collective.
    calls = [row["data"]["frame"]["func"] for row in collective_frames(job).values()]
    if calls:
        return f"the {max(set(calls), key=calls.count)}"
    d = timeouts[0]["data"]
    if d.get("op"):
        return f"collective {d['op']}"
    return "the collective"


def _first_call_alone(job: Job, events: pl.DataFrame, timed_out: pl.DataFrame,
                      others: set[int]) -> bool:
    """The ranks timed out in the process group's very first collective (SeqNum 1), and no
    other rank left a line at all, nor any rank a line of work or progress: nothing says a
    rank was elsewhere. A first collective that never completes is as often a transport that
    cannot move data between the GPUs (P2P through an IOMMU or ACS, a driver) as a rank that
    never came: no rank is named (the best-effort verdict says what is known)."""
    found = [json.loads(d) for d in timed_out.filter(
        pl.col("kind") == "watchdog_timeout")["data"].drop_nulls().to_list()]
    # (a broadcast is different: its root, most often rank 0 sending a decision or the weights,
    # is one rank the others wait for)
    if {d.get("seq") for d in found} != {1} or others \
            or any(d.get("op") == "BROADCAST" for d in found):
        return False
    if job.rows("rank_local_work"):
        return False
    bars = events.filter((pl.col("kind") == "last_line") & pl.col("data").is_not_null())
    return not any(json.loads(d).get("progress") for d in bars["data"].to_list())


def _unranked_crash(job: Job) -> bool:
    """Whether a process of the job crashed whose rank the inputs do not say."""
    crashes = job.crashes.events
    return bool(crashes.height) and crashes.filter(pl.col("rank").is_null()).height > 0


#: Collective calls of a job's set-up, not after a training loop.
SETUP = frozenset({"init_process_group", "new_group", "_store_based_barrier"})


def backward_split(job: Job) -> tuple[dict[int, dict], dict[int, dict]]:
    """(ranks whose last traceback, a timeout or a lost peer, ends in autograd's backward,
    DDP's gradient all-reduce; ranks whose last such traceback ends in a collective call)."""
    last = _last_by_rank(r for r in job.rows("exception") if CONSEQUENCE.search(r["text"]))
    back, other = {}, {}
    for rank, row in last.items():
        frame = row["data"].get("frame") or {}
        if frame.get("func") in BACKWARD_WAITS and "torch/autograd" in str(frame.get("file")):
            back[rank] = row
        elif frame.get("func") in COLLECTIVES - SETUP \
                and str(frame.get("file", "")).endswith("distributed_c10d.py"):
            other[rank] = row
    return back, other
