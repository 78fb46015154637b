"""The job as a Chrome trace (``ddp-autopsy export --format perfetto PATHS -o trace.json``):
open it in ui.perfetto.dev or chrome://tracing.

Trace Event Format (the JSON object form, ``{"traceEvents": [...]}``):

- one process per rank (``pid`` = rank + 1, named ``rank N · host`` by ``process_name``
  metadata, ordered by ``process_sort_index``), plus one for lines no rank claims
  (the launcher);
- in each, thread ``logs`` (``tid`` = pid × 10 + 1): every timestamped recognised log line as an
  instant event (``ph`` ``i``, scope ``t``), named by its kind, the line in ``args``;
- thread ``collectives`` (+2): the rank's Flight Recorder entries as complete events (``ph``
  ``X``) from start (or enqueue) to completion; one never completed lasts until the end of the
  trace, ``args.state`` says so;
- thread ``stacks`` (+3): each py-spy dump as an instant at its bundle's collection time, the
  main thread's frames (innermost first) in ``args``;
- the findings as global instants (scope ``g``).

``ts`` is in microseconds from the first moment in the trace. Log text is redacted like the
HTML report's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import polars as pl

from ddp_autopsy.redact import redact_text
from ddp_autopsy.reports.html.timeline import KIND_CATEGORY, collected_at
from ddp_autopsy.rules.engine import Analysis

TEXT_LIMIT = 400  # characters of a log line kept in args
LOGS, COLLECTIVES, STACKS = 1, 2, 3  # thread of each kind, tid = pid * 10 + this
THREAD_NAMES = {LOGS: "logs", COLLECTIVES: "collectives (Flight Recorder)", STACKS: "stacks"}


def _local(ts: datetime | None) -> datetime | None:
    """Flight Recorder times are UTC; log stamps are local and naive: compare them as the
    latter."""
    if ts is None:
        return None
    return ts.astimezone().replace(tzinfo=None) if ts.tzinfo else ts


def _text(s: Any) -> str:
    t = redact_text(str(s or "")).replace("\r", "")
    return t if len(t) <= TEXT_LIMIT else t[: TEXT_LIMIT - 1] + "…"


def trace(analysis: Analysis) -> dict[str, Any]:
    """The trace as a JSON-ready dict."""
    job = analysis.job
    ev = job.events.filter(pl.col("ts").is_not_null()) if job.events.height else job.events
    coll = job.collectives
    collected = collected_at(job)
    moments: list[datetime] = [t for t, _ in collected]
    if ev.height:
        moments += [ev["ts"].min(), ev["ts"].max()]  # type: ignore[list-item]
    if coll.height:
        for col in ("time_created", "time_started", "time_completed"):
            lo, hi = coll[col].min(), coll[col].max()
            moments += [t for t in (_local(lo), _local(hi)) if t is not None]  # type: ignore[arg-type]
    for f in analysis.findings:
        if f.ts is not None:
            moments.append(f.ts)
    t0 = min(moments) if moments else datetime(1970, 1, 1)
    t_end = max(moments) if moments else t0

    def us(t: datetime) -> float:
        return round((t - t0).total_seconds() * 1e6, 3)

    ranks = set(job.rank_state["rank"].to_list()) if job.rank_state.height else set()
    if ev.height:
        ranks |= set(ev["rank"].drop_nulls().to_list())
    if coll.height:
        ranks |= set(coll["rank"].drop_nulls().to_list())
    if job.stacks.height:
        ranks |= set(job.stacks["rank"].drop_nulls().to_list())
    other = (max(ranks) + 2) if ranks else 1  # the pid of lines no rank claims
    hosts = dict(job.rank_state.select("rank", "host").iter_rows()) if job.rank_state.height \
        else {}
    culprits = set(analysis.verdict.ranks) if analysis.verdict else set()

    def pid(rank: int | None) -> int:
        return other if rank is None else rank + 1

    out: list[dict[str, Any]] = []
    used: set[tuple[int, int]] = set()

    def add(rank: int | None, thread: int, event: dict[str, Any]) -> None:
        p = pid(rank)
        used.add((p, thread))
        out.append({**event, "pid": p, "tid": p * 10 + thread})

    if ev.height:
        for kind, rank, ts, text, source, line, host in ev.select(
                "kind", "rank", "ts", "text", "source", "line", "host").iter_rows():
            args = {"text": _text(text), "source": _text(f"{source}:{line}")}
            if host:
                args["host"] = _text(host)
            add(rank, LOGS, {"ph": "i", "s": "t", "name": kind,
                             "cat": KIND_CATEGORY.get(kind, "other"), "ts": us(ts),
                             "args": args})
    if coll.height:
        for row in coll.filter(pl.col("rank").is_not_null()).iter_rows(named=True):
            begin = _local(row["time_started"]) or _local(row["time_created"])
            if begin is None:
                continue
            end = _local(row["time_completed"])
            state = row["state"] or ("completed" if end else "?")
            name = row["profiling_name"] or row["op"] or "collective"
            args = {"state": state, "pg": _text(row["pg_name"] or row["pg_id"]),
                    "seq": row["collective_seq_id"], "op": row["op"],
                    "input_sizes": row["input_sizes"], "input_dtypes": row["input_dtypes"]}
            if row["site_file"]:
                args["call_site"] = _text(f"{row['site_func']} "
                                          f"({row['site_file']}:{row['site_line']})")
            if end is None:
                args["never_completed"] = True
            stop = end if end is not None and end >= begin else t_end
            add(row["rank"], COLLECTIVES, {"ph": "X", "name": _text(name), "cat": "collective",
                                           "ts": us(begin),
                                           "dur": max(us(stop) - us(begin), 1.0), "args": args})
    if job.stacks.height:
        when_of = {host: t for t, host in collected}
        main = job.stacks.filter(pl.col("thread_id") == pl.col("pid")) \
            if "pid" in job.stacks.columns else job.stacks
        if main.height == 0:
            main = job.stacks
        rank_of_pid = {p: r for r, p in job.rank_state.select("rank", "pid").iter_rows()
                       if p is not None} if job.rank_state.height else {}
        for (source, rank, host, proc), rows in main.sort("depth").group_by(
                ["source", "rank", "host", "pid"], maintain_order=True):
            rank = rank if rank is not None else rank_of_pid.get(proc)
            frames = [f"{fn} ({fl}:{ln})" for fn, fl, ln in
                      rows.select("func", "file", "line").iter_rows()]
            when = when_of.get(host or "") or (collected[0][0] if collected else t_end)
            add(rank, STACKS, {"ph": "i", "s": "t",
                               "name": f"stack: {_text(rows['func'][0])}", "cat": "stack",
                               "ts": us(when), "args": {"frames": [_text(f) for f in frames],
                                                         "source": _text(source)}})
    for f in analysis.findings:
        if f.ts is not None:
            out.append({"ph": "i", "s": "g", "name": f"{f.id} {f.rule} {f.slug}",
                        "cat": "finding", "ts": us(f.ts), "pid": 0, "tid": 0,
                        "args": {"summary": _text(f.summary), "role": f.role}})
    meta: list[dict[str, Any]] = []
    for p in sorted({p for p, _ in used}):
        rank = None if p == other else p - 1
        label = "launcher / no rank" if rank is None else f"rank {rank}"
        if rank is not None and hosts.get(rank):
            label += f" · {_text(hosts[rank])}"
        if rank in culprits:
            label += " · culprit"
        meta.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                     "args": {"name": label}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                     "args": {"sort_index": p}})
    if any(e["pid"] == 0 for e in out):
        meta.append({"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
                     "args": {"name": "findings"}})
    for p, thread in sorted(used):
        meta.append({"ph": "M", "name": "thread_name", "pid": p, "tid": p * 10 + thread,
                     "args": {"name": THREAD_NAMES[thread]}})
    return {"traceEvents": meta + out, "displayTimeUnit": "ms",
            "otherData": {"generator": "ddp-autopsy", "t0": t0.isoformat(sep=" "),
                          "untimed_log_events": job.events.height - ev.height}}


def write(analysis: Analysis, path: Path) -> int:
    """Write the trace; return its number of events."""
    data = trace(analysis)
    with open(path, "w", encoding="utf-8") as fh:
        for chunk in _chunks(data):
            fh.write(chunk)
    return len(data["traceEvents"])


def _chunks(data: dict[str, Any]) -> Iterator[str]:
    """The JSON a few events at a time (one line per event: diffable, greppable)."""
    yield '{"traceEvents": [\n'
    events = data["traceEvents"]
    for i, e in enumerate(events):
        yield json.dumps(e, ensure_ascii=False, default=str) + (",\n" if i < len(events) - 1
                                                                 else "\n")
    rest = {k: v for k, v in data.items() if k != "traceEvents"}
    yield "], " + json.dumps(rest, default=str)[1:] + "\n"


@click.command("export")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["perfetto"]), default="perfetto",
              show_default=True, help="perfetto: Chrome trace event JSON (ui.perfetto.dev).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the trace (trace.json).")
def export_command(paths: tuple[Path, ...], fmt: str, output: Path) -> None:
    """Export the job's timeline as a Chrome trace / Perfetto JSON (one track per rank)."""
    from ddp_autopsy.cli import _analyze, _check_output

    _check_output(output)
    analysis = _analyze(paths)
    try:
        n = write(analysis, output)
    except OSError as err:
        click.echo(f"ddp-autopsy export: cannot write {output}: {err}", err=True)
        sys.exit(2)
    click.echo(f"{output}: {n:,} trace events ({fmt}); open it in ui.perfetto.dev", err=True)
