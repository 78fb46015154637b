"""Facts derived from the parsed job: each view computed at most once per :class:`Job`.

The frames (``events``, ``stacks``...) are what the inputs said; facts are what follows from
them — the merged stack tree, the collective report, the crashed ranks, the per-rank state, the
events that still count. Rules and reports read the same fact objects through ``job.fact(name)``
(or the typed properties on :class:`~ddp_autopsy.analyzer.job.Job`); a rule declares the names it
uses (``requires`` / ``optional``), and the engine checks them against :data:`KNOWN`.

>>> sorted(FACTS)
['active_events', 'collective_report', 'crashes', 'rank_state', 'stack_tree']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job


@dataclass(frozen=True)
class Fact:
    name: str
    build: Callable[[Job], Any]
    #: Whether the inputs hold what the fact is made of (a rule requiring it is otherwise
    #: "not evaluated", naming the fact).
    available: Callable[[Job], bool]
    doc: str


def _stack_tree(job: Job) -> Any:
    from ddp_autopsy.analyzer import stacktree

    return stacktree.build(job.stacks, job.processes if job.processes.height else None)


def _collective_report(job: Job) -> Any:
    from ddp_autopsy.analyzer import collectives

    return collectives.build_report(job)


def _crashes(job: Job) -> Any:
    from ddp_autopsy.analyzer import crashes

    return crashes.build(job)


def _rank_state(job: Job) -> Any:
    from ddp_autopsy.analyzer import rankstate

    return rankstate.build(job)


def _active_events(job: Job) -> Any:
    return job.history_split()[0]


FACTS: dict[str, Fact] = {f.name: f for f in (
    Fact("stack_tree", _stack_tree, lambda job: job.stacks.height > 0,
         "all ranks' main-thread stacks merged into one tree (analyzer/stacktree.py)"),
    Fact("collective_report", _collective_report,
         lambda job: job.fr_dumps.height > 0 or job.events.height > 0,
         "per process group: who waits, who never joined, divergence, stragglers "
         "(analyzer/collectives.py)"),
    Fact("crashes", _crashes, lambda job: job.has("events"),
         "ranks that crashed, and the earliest crash (analyzer/crashes.py)"),
    Fact("rank_state", _rank_state, lambda job: True,
         "one row per rank: host, pid, state, frame, collective, last line "
         "(analyzer/rankstate.py)"),
    Fact("active_events", _active_events, lambda job: job.has("events"),
         "events without those a later clean restart made history (analyzer/job.py)"),
)}

#: The frames a rule may require (``Job.has`` tells whether the inputs held them).
FRAMES: tuple[str, ...] = ("events", "stacks", "collectives", "env", "processes", "ranks",
                           "bundles")
#: Every name a rule may declare in ``requires`` / ``optional``.
KNOWN: frozenset[str] = frozenset(FRAMES) | frozenset(FACTS)
