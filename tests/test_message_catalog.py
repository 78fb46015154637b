"""The message catalog (docs/messages/*.jsonl): every template's example line, scanned by the
real analyzer, becomes the event kind the catalog states; an ignored one becomes no failure.
docs/messages.md is generated from it and must be current."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from ddp_autopsy.analyzer.events import FileContext, scan_text
from ddp_autopsy.analyzer.patterns import TAGS

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "docs" / "messages" / "catalog.jsonl"
INVENTORY = ROOT / "docs" / "messages" / "nccl-warn.jsonl"
SCRIPT = ROOT / "scripts" / "message_catalog.py"


def entries(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


CURATED = entries(CATALOG)
NCCL = entries(INVENTORY)


def kinds_of(text: str) -> list[str]:
    """The event kinds the analyzer makes of ``text`` (a line, or a block for summaries)."""
    ctx = FileContext("example.log", 2026, ref_time=datetime(2026, 11, 22))
    rows = scan_text(io.BytesIO(text.encode() + b"\n"), ctx, [])
    return [r["kind"] for r in rows if r["kind"] != "last_line"]


def check(entry: dict) -> None:
    kinds = kinds_of(entry["example"])
    if entry.get("ignored"):
        failing = [k for k in kinds if "failure" in TAGS.get(k, ())]
        assert not failing, f"ignored ({entry['why']}) but read as {failing}"
    else:
        assert entry["kind"] in kinds, f"expected {entry['kind']}, got {kinds}"


@pytest.mark.parametrize("entry", CURATED, ids=[e["id"] for e in CURATED])
def test_curated_example_becomes_its_kind(entry: dict) -> None:
    check(entry)


@pytest.mark.parametrize("entry", NCCL, ids=[f"nccl-warn-{i}" for i in range(len(NCCL))])
def test_every_nccl_warn_format_is_classified(entry: dict) -> None:
    """A failure kind, or ignored only as an advisory (NCCL falls back and goes on)."""
    if entry.get("ignored"):
        assert entry["why"].startswith("advisory"), f"unclassified: {entry['example']!r}"
    check(entry)


def test_entries_are_well_formed() -> None:
    ids = [e["id"] for e in CURATED]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for e in CURATED + NCCL:
        assert {"template", "versions", "example"} <= e.keys(), e
        assert ("kind" in e) != bool(e.get("ignored")), e
        if e.get("ignored"):
            assert e.get("why"), e
        else:
            assert e["kind"] in TAGS, f"unknown kind {e['kind']}"
    for e in CURATED:
        assert e.get("source") and e.get("component"), e


def test_known_real_wordings_are_classified() -> None:
    """Wordings found in real users' logs that the catalog once missed."""
    real = {
        "ValueError: host not found: Name or service not known": "unresolved_host",
        "RuntimeError: connect() timed out. Original timeout was 60000 ms.": "connect_timeout",
        "gpu1:1:1 [0] NCCL INFO socketPollConnect: connect returned No route to host, retrying "
        "(34/34)": "nccl_connect_failure",
        "gpu1:1:1 [0] misc/socket.cc:538 NCCL WARN socketPollConnect: Connect to 10.0.0.2<43211> "
        "returned 113(No route to host) errno 115": "nccl_connect_failure",
        "Timed out initializing process group in store based barrier on rank: 0, for key: "
        "store_based_barrier_key:1 (world_size=2, worker_count=4, timeout=0:02:00)":
            "store_clients_timeout",
        "ssh: Could not resolve hostname node-0: Name or service not known": "unresolved_host",
        "(raylet) 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
        "crashed due to other reasons at node (ID: 1, IP: 10.0.0.5) over the last time period.":
            "oom",
    }
    for line, kind in real.items():
        assert kind in kinds_of(line), line


def test_an_nccl_warn_read_by_a_specific_pattern_is_not_also_the_fallback() -> None:
    kinds = kinds_of("gpu1:1:1 [0] enqueue.cc:1 NCCL WARN Cuda failure 700 'an illegal memory "
                     "access was encountered'")
    assert kinds == ["cuda_failure"]


def test_a_transient_nccl_retry_is_not_a_failure() -> None:
    kinds = kinds_of("gpu1:1:1 [0] NCCL INFO socketPollConnect: connect returned Connection "
                     "refused, retrying (3/34) after sleep for 300 msec")
    assert kinds == ["nccl_connect_retry"]


def test_generated_doc_is_current() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
