"""``ddp-autopsy export --format perfetto``: the Chrome trace of a job, checked event by event
against the Trace Event Format (the JSON object form): every event well formed, one process
(track group) per rank with its name, log lines as instants, Flight Recorder entries as slices,
stack samples as instants. Where Perfetto's trace processor is importable, the trace is loaded
there too."""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_flight_recorder import nccl_dump, nccl_entry
from test_html_report import write_hang

from ddp_autopsy.cli import main

PHASES = set("BEXIiIbneMCsftPNODRcpnv") | {"(", ")"}
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name",
            "thread_sort_index"}


def check_event(e: dict[str, Any]) -> None:
    """One event against the Trace Event Format's requirements for its phase."""
    assert isinstance(e, dict), e
    assert e.get("ph") in PHASES, e
    assert isinstance(e.get("name"), str) and e["name"], e
    for key in ("pid", "tid"):
        assert isinstance(e.get(key), int) and not isinstance(e[key], bool), e
    if "args" in e:
        assert isinstance(e["args"], dict), e
    if "cat" in e:
        assert isinstance(e["cat"], str), e
    if e["ph"] == "M":
        assert e["name"] in METADATA, e
        key = "sort_index" if e["name"].endswith("sort_index") else "name"
        assert key in e["args"], e
        return
    assert isinstance(e.get("ts"), numbers.Real) and e["ts"] >= 0, e
    if e["ph"] == "X":
        assert isinstance(e.get("dur"), numbers.Real) and e["dur"] >= 0, e
    if e["ph"] in ("i", "I"):
        assert e.get("s", "t") in ("g", "p", "t"), e


def write_job(root: Path) -> Path:
    """A 3-rank hang (rank 1 in evaluate, stacks and timeouts) with Flight Recorder dumps:
    ranks 0 and 2 completed all_reduce #1-#4 and started #5; rank 1 stopped after #4."""
    job = write_hang(root, world=3, odd=1)
    fr = root / "fr"
    fr.mkdir()
    for r in range(3):
        entries = [nccl_entry(s) for s in range(1, 5)]
        if r != 1:
            entries.append(nccl_entry(5, state="started"))
        (fr / f"nccl_trace_rank_{r}").write_bytes(nccl_dump(entries, ranks="[0, 1, 2]"))
    return job


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("perfetto")
    job = write_job(root / "job")
    out = root / "trace.json"
    result = CliRunner().invoke(main, ["export", "--format", "perfetto", str(job), "-o",
                                       str(out)])
    assert result.exit_code == 0, result.output
    assert "trace events" in result.output
    return json.loads(out.read_text(encoding="utf-8"))


def test_every_event_is_well_formed(exported: dict[str, Any]) -> None:
    events = exported["traceEvents"]
    assert isinstance(events, list) and len(events) > 20
    for e in events:
        check_event(e)
    assert exported["displayTimeUnit"] in ("ms", "ns")


def test_one_named_track_per_rank(exported: dict[str, Any]) -> None:
    events = exported["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    ranks = sorted(int(n.split()[1]) for n in names.values() if n.startswith("rank "))
    assert ranks == [0, 1, 2]
    assert len({n.split(" · ")[0] for n in names.values()}) == len(names)  # one per rank
    assert [n for n in names.values() if n.endswith("culprit")] == ["rank 1 · culprit"]
    for e in events:  # every event sits on a named process and thread
        if e["ph"] != "M":
            assert e["pid"] in names, e
            assert e["tid"] == 0 or (e["pid"], e["tid"]) in threads, e


def _on(events: list[dict[str, Any]], rank: int, cat: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == cat and e["pid"] == rank + 1]


def test_logs_collectives_and_stacks_per_rank(exported: dict[str, Any]) -> None:
    events = exported["traceEvents"]
    timeouts = [e for e in events if e["name"] == "watchdog_timeout"]
    assert sorted(e["pid"] - 1 for e in timeouts) == [0, 2]
    assert all(e["ph"] == "i" and "Watchdog caught" in e["args"]["text"] for e in timeouts)
    for rank, n, pending in ((0, 5, 1), (1, 4, 0), (2, 5, 1)):
        slices = _on(events, rank, "collective")
        assert len(slices) == n and all(e["ph"] == "X" for e in slices), slices
        assert sum(bool(e["args"].get("never_completed")) for e in slices) == pending
        assert sorted(e["args"]["seq"] for e in slices) == list(range(1, n + 1))
        stacks = _on(events, rank, "stack")
        assert len(stacks) == 1 and stacks[0]["ph"] == "i"
        inner = "evaluate" if rank == 1 else "all_reduce"
        assert stacks[0]["args"]["frames"][1 if rank == 1 else 0].startswith(inner)
    # The unfinished collective lasts to the end of the trace, not zero time.
    end = max(e["ts"] + e.get("dur", 0) for e in events if e["ph"] != "M")
    pending = [e for e in _on(events, 0, "collective") if e["args"].get("never_completed")]
    assert pending[0]["ts"] + pending[0]["dur"] == pytest.approx(end, abs=1)
    findings = [e for e in events if e.get("cat") == "finding"]
    assert findings and all(e["s"] == "g" for e in findings)


def test_bad_output_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    job = write_hang(tmp_path / "job")
    result = CliRunner().invoke(main, ["export", str(job), "-o",
                                       str(tmp_path / "nowhere" / "t.json")])
    assert result.exit_code == 2 and "cannot write" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_loads_in_perfettos_trace_processor(exported: dict[str, Any], tmp_path: Path) -> None:
    tp_mod = pytest.importorskip(
        "perfetto.trace_processor",
        reason="perfetto's Python package is not installed; it downloads the trace processor "
               "binary from the network, which these machines cannot reach")
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(exported))
    try:
        tp = tp_mod.TraceProcessor(trace=str(path))
    except Exception as err:  # no binary and no network: say so
        pytest.skip(f"trace processor unavailable (it is fetched from the network): {err}")
    try:
        names = {r.name for r in tp.query("select name from process")}
        assert {"rank 0", "rank 1 · culprit", "rank 2"} <= names
    finally:
        tp.close()
