"""Which ranks crashed: the one definition the collective report, the rules and the reports use.

A rank crashed when an active event tagged ``crash`` (an exception, a torchelastic failure entry,
a failed spawn, an OOM) is attributed to it, by its prefix or by the rank field of a torchelastic
summary entry.

A worker that its own launcher stopped did not crash: after one worker fails, torchelastic sends
the others ``Sending process PID closing signal SIGTERM`` (then SIGKILL to those that do not stop:
``Unable to shutdown process PID via 15, forcefully exiting via 9``), and its failure summary then
lists them with exit code -15 or -9. Such an entry (same process id as a closing signal its
launcher sent, in the same log or on the same host) is the teardown, not a crash; the rank is in
``stopped`` instead, so a rank frozen or busy when the others failed is not called crashed.

An exception did not end its process when it was raised in a thread of its own (Python's
"Exception in thread NAME:" just above the traceback), or when it was logged in a bundle whose
stack dump then found that rank's process alive (unless its traceback starts at ``<module>``, an
uncaught one, and the main thread has no ``<module>`` frame left: the program is over and an
exit hook runs), or followed in the same file by that rank's own
logger reporting progress (a stamped INFO line with a step, an epoch, a loss: a caught, logged
exception): none is a crash. Printed lines do not count: stdout is buffered, and a crashing
rank's last prints are flushed after its traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from ddp_autopsy.analyzer.patterns import kinds_tagged

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job

CRASH_KINDS: tuple[str, ...] = kinds_tagged("crash")
#: Exit codes of a process ended by its launcher's SIGTERM or SIGKILL.
TEARDOWN_EXITS = (-15, -9)


@dataclass(frozen=True)
class Crashes:
    #: Ranks the logs show crashing.
    ranks: frozenset[int] = frozenset()
    #: The crash events themselves (active rows only), in input order.
    events: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Ranks whose only failure is their launcher's teardown signal: rank -> exit code.
    stopped: dict[int, int] = field(default_factory=dict)
    #: Process ids of the workers their launcher stopped (ranked or not).
    stopped_pids: frozenset[int] = frozenset()
    #: (source, line) of the exceptions that did not end their process (module docstring).
    survived: frozenset[tuple[str, int]] = frozenset()

    def survived_row(self, row: dict) -> bool:
        """Whether the exception event ``row`` did not end its process."""
        return (row["source"], row["line"]) in self.survived

    def __contains__(self, rank: object) -> bool:
        return rank in self.ranks


def _data(row: dict) -> dict:
    return json.loads(row.get("data") or "{}")


def _closed(events: pl.DataFrame) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """(source, pid) and (host, pid) of the processes a launcher sent a closing signal."""
    by_source: set[tuple[str, int]] = set()
    by_host: set[tuple[str, int]] = set()
    for row in events.filter(pl.col("kind") == "closing_signal").iter_rows(named=True):
        d = _data(row)
        pid = next((d[k] for k in ("pid", "pid2", "pid3", "pid4") if isinstance(d.get(k), int)),
                   None)
        if pid is None:
            continue
        by_source.add((row["source"], pid))
        if row.get("host"):
            by_host.add((row["host"], pid))
    return by_source, by_host


#: A line that reports training or evaluation going on.
WORK_GOES_ON = re.compile(r"(?i)\b(?:step|epoch|iter(?:ation)?|batch|loss)\b[ =:]*\d")
FAILURE_WORDS = re.compile(r"(?i)error|exception|traceback|fail|abort|timed? ?out|killed")


def _main_returned(stacks: pl.DataFrame) -> set[tuple[int, int]]:
    """(rank, pid) of the processes alive in a stack dump whose main thread is no longer in the
    program: no ``<module>`` frame under it. The main module returned or raised, and the
    interpreter is finishing (atexit handlers, finalizers, joining threads): an uncaught
    exception logged before did end the program."""
    if not stacks.height or "thread_name" not in stacks.columns:
        return set()
    main = stacks.filter((pl.col("thread_name") == "MainThread") & pl.col("rank").is_not_null())
    if not main.height:
        return set()
    per = main.group_by("rank", "pid").agg((pl.col("func") == "<module>").any().alias("module"))
    return {(r["rank"], r["pid"]) for r in per.filter(~pl.col("module")).iter_rows(named=True)}


def _survivor_test(job: Job) -> Callable[[str, int | None, dict, int], bool]:
    """``survived(source, rank, data, line)`` for an exception event: true when it did not end
    its process (see the module docstring)."""
    headers = {(r["source"], r["line"]) for r in job.rows("thread_exception")}
    alive: dict[str, set[int]] = {}
    procs = job.processes
    returned = {rank for rank, _ in _main_returned(job.stacks)}
    if procs.height and {"stack_status", "bundle"} <= set(procs.columns):
        for row in procs.filter((pl.col("role") == "worker") & (pl.col("stack_status") == "ok")
                                & pl.col("rank").is_not_null()).iter_rows(named=True):
            alive.setdefault(str(row["bundle"]), set()).add(row["rank"])

    # each rank's last line per file when a logger's INFO line reports work going on (a step,
    # an epoch, a loss). A logger writes to stderr like the traceback, so its order is true;
    # print()ed stdout is buffered and may land after a crash's traceback.
    went_on = {(r["source"], r["rank"]): r["line"] for r in job.rows("last_line")
               if r["rank"] is not None and r["level"] == "I" and r["ts"] is not None
               and WORK_GOES_ON.search(r["text"]) and not FAILURE_WORDS.search(r["text"])}

    def survived(source: str, rank: int | None, data: dict, line: int) -> bool:
        tb = data.get("traceback_line")
        if isinstance(tb, int) and (source, tb - 1) in headers:
            return True
        if went_on.get((source, rank), -1) > line:
            return True  # a caught, logged exception: the rank's work went on after it
        if rank in returned and data.get("outer") == "<module>":
            return False  # uncaught (its traceback starts at the module): it ended the program
        return rank is not None and any(
            str(source).startswith(f"{bundle}/") and rank in ranks
            for bundle, ranks in alive.items())

    return survived


def build(job: Job) -> Crashes:
    events = job.active_events
    if events.height == 0:
        return Crashes()
    rows = events.filter(pl.col("kind").is_in(CRASH_KINDS))
    by_source, by_host = _closed(events)
    keep: list[bool] = []
    stopped: dict[int, int] = {}
    pids: set[int] = set()
    survives = _survivor_test(job)
    survived: set[tuple[str, int]] = set()
    for row in rows.iter_rows(named=True):
        if row["kind"] == "exception" and survives(row["source"], row["rank"], _data(row),
                                                   row["line"]):
            survived.add((row["source"], row["line"]))
            keep.append(False)
            continue
        d = _data(row) if row["kind"] in ("elastic_failure", "worker_failed") else {}
        pid, code = d.get("pid"), d.get("exitcode")
        host = d.get("host") or row.get("host")
        teardown = code in TEARDOWN_EXITS and isinstance(pid, int) and (
            (row["source"], pid) in by_source or (host is not None and (host, pid) in by_host))
        keep.append(not teardown)
        rank = d.get("rank", row["rank"])
        if teardown:
            pids.add(pid)
            if isinstance(rank, int):
                stopped[rank] = code
    rows = rows.filter(pl.Series(keep, dtype=pl.Boolean)) if rows.height else rows
    ranks = set(rows["rank"].drop_nulls().to_list())
    for data in rows.filter(pl.col("kind") == "elastic_failure")["data"].to_list():
        rank = json.loads(data or "{}").get("rank")
        if isinstance(rank, int):
            ranks.add(rank)
    return Crashes(frozenset(ranks), rows,
                   {r: c for r, c in stopped.items() if r not in ranks}, frozenset(pids),
                   frozenset(survived))
