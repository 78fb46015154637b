"""The per-rank table: one row per rank the inputs name or the world size implies.

Columns (``RANK_STATE_SCHEMA``): ``rank``, ``host``, ``pid``, ``state``, ``why``, ``frame`` (the
innermost user frame of its stack), ``collective`` (the torch.distributed call it waits in),
``seq`` (its pending or last collective in the default group's Flight Recorder, else the sequence
its timeout names), ``last_line`` / ``last_time`` / ``last_source`` (the last thing its log said).

A rank's ``state`` is the first that applies:

==========  ===============================================================================
crashed     an exception, failure entry, failed spawn or OOM is attributed to it
frozen      it cannot run: stopped (``/proc`` state T, SIGSTOP or a debugger), its main thread
            holding the GIL while blocked in native code (py-spy: idle, owns the GIL), or its
            stack could not be taken in time (py-spy timed out)
busy        its stack is outside any collective (while others wait, it is the suspect)
failed      it timed out, or lost a peer, waiting for the others
waiting     its stack waits in a torch.distributed call
exited      collect found its process gone, or its launcher stopped it (SIGTERM, SIGKILL)
seen        in the logs or stacks, nothing wrong
missing     within the world size, but absent from every input
==========  ===============================================================================

The verdict's culprits are an analysis matter, not a job fact: reports mark them on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from ddp_autopsy.analyzer.patterns import kinds_tagged

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job

STATES: tuple[tuple[str, str], ...] = (
    ("crashed", "raised, exited with an error or ran out of memory"),
    ("frozen", "cannot run: stopped, holding the GIL in native code, or no stack in time"),
    ("busy", "its stack is outside any collective"),
    ("failed", "timed out or lost a peer waiting for the others"),
    ("waiting", "its stack waits in a torch.distributed call"),
    ("exited", "its process was gone when collected, or its launcher stopped it"),
    ("seen", "in the logs or stacks, nothing wrong"),
    ("missing", "within the world size, but absent from every input"),
)
STATE_NAMES: tuple[str, ...] = tuple(s for s, _ in STATES)

RANK_STATE_SCHEMA: dict[str, Any] = {
    "rank": pl.Int64, "host": pl.String, "pid": pl.Int64, "state": pl.String, "why": pl.String,
    "frame": pl.String, "collective": pl.String, "seq": pl.Int64, "last_line": pl.String,
    "last_time": pl.Datetime("us"), "last_source": pl.String,
}

LOST_PEER_KINDS = kinds_tagged("lost_peer")


def build(job: Job) -> pl.DataFrame:
    rows: dict[int, dict[str, Any]] = {}
    why: dict[str, dict[int, str]] = {s: {} for s in STATE_NAMES}

    empty = dict.fromkeys(RANK_STATE_SCHEMA)

    def row(r: int) -> dict[str, Any]:
        x = rows.get(r)  # (made once: asked ~5 times a rank)
        if x is None:
            x = rows[r] = {**empty, "rank": r}
        return x

    if job.ranks.height:
        for r, hosts, pids in job.ranks.select("rank", "hosts", "pids").iter_rows():
            x = row(r)
            x["host"] = hosts[0] if hosts else None
            x["pid"] = pids[0] if pids else None
    events = job.active_events
    for r in job.crashes.ranks:
        why["crashed"].setdefault(r, "crashed")
    for r, code in job.crashes.stopped.items():
        sig = {-15: "SIGTERM", -9: "SIGKILL"}.get(code, f"exit code {code}")
        why["exited"].setdefault(r, f"stopped by its launcher ({sig}) as the job was torn down")
    if events.height:
        crash = job.crashes.events
        ranked = crash.filter(pl.col("rank").is_not_null())
        for r, kind in ranked.select("rank", "kind").iter_rows():
            why["crashed"][r] = kind.replace("_", " ")
        failed = (events.filter(pl.col("kind").is_in(LOST_PEER_KINDS)
                                & pl.col("rank").is_not_null())
                  .group_by("rank", maintain_order=True).agg(pl.col("kind").first()))
        for r, kind in failed.select("rank", "kind").iter_rows():
            why["failed"].setdefault(r, kind.replace("_", " "))
        last = events.filter((pl.col("kind") == "last_line") & pl.col("rank").is_not_null())
        for r, text, ts, source in last.select("rank", "text", "ts", "source").iter_rows():
            x = row(r)
            if x["last_time"] is None or (ts is not None and ts >= x["last_time"]):
                x["last_line"], x["last_time"], x["last_source"] = text, ts, source
    if job.stacks.height:
        for r, cls in job.stack_tree.by_rank().items():
            x = row(r)
            x["frame"] = str(cls.user_frame) if cls.user_frame else (
                str(cls.innermost) if cls.innermost else None)
            if cls.collective is not None:
                x["collective"] = cls.collective.func
                why["waiting"][r] = f"waiting in {cls.collective.func} (stack {cls.id})"
            else:
                place = f", {cls.place}" if cls.place else ""
                why["busy"][r] = f"in {x['frame'] or 'an unknown frame'}{place} (stack {cls.id})"
    if job.processes.height:
        for r, status, state in (job.processes.filter(pl.col("rank").is_not_null()
                                                      & (pl.col("role") == "worker"))
                                 .select("rank", "stack_status", "proc_state").iter_rows()):
            if state in ("T", "t"):
                why["frozen"].setdefault(r, "stopped (/proc state T: SIGSTOP, or a debugger)")
            elif status == "timeout":
                why["frozen"].setdefault(r, "py-spy could not read its stack in time")
            elif status == "exited":
                why["exited"].setdefault(r, "its process was gone when collected")
    if job.stacks.height:
        gil = job.stacks.filter((pl.col("thread_name") == "MainThread") & pl.col("idle")
                                & pl.col("owns_gil") & pl.col("rank").is_not_null())
        for r in gil["rank"].unique().to_list():
            why["frozen"].setdefault(r, "its main thread holds the GIL while blocked in native "
                                        "code (py-spy: idle, owns the GIL)")
    report = job.collective_report
    if report.groups:  # the default group (or the first the inputs name)
        for r, st in report.groups[0].ranks.items():
            call = st.pending or st.last
            x = row(r)
            x["seq"] = call.seq if call is not None else st.timed_out_at
            x["collective"] = x["collective"] or (call.op if call is not None
                                                  else st.timed_out_op)
    seen = set(rows)
    for states in why.values():
        seen.update(states)
    universe = set(seen)
    world = job.world_size
    if world:
        universe.update(range(world))
    for r in sorted(x for x in universe if x is not None and x >= 0):
        x = row(r)
        for state in STATE_NAMES[:-2]:
            if r in why[state]:
                x["state"], x["why"] = state, why[state][r]
                break
        else:
            x["state"], x["why"] = (("seen", "no failure recorded") if r in seen
                                    else ("missing", "no input names this rank"))
    out = [rows[r] for r in sorted(rows) if r >= 0]
    return pl.DataFrame(out, schema=RANK_STATE_SCHEMA) if out \
        else pl.DataFrame(schema=RANK_STATE_SCHEMA)
