"""The bundle layout shared by the writer and the reader, and pre-parsed summaries that go
stale when the tool or its message catalog changes."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.collectors import summaries
from ddp_autopsy.rules.engine import run

PORT_IN_USE = ("[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 "
               "(errno: 98 - Address already in use).")


def _bundle(root: Path, *, network: str | None = None) -> Path:
    root.mkdir()
    log = root / layout.log_copy("/run/train.log")
    log.parent.mkdir(parents=True)
    log.write_text(PORT_IN_USE + "\n")
    manifest = {"schema": layout.SCHEMA, "host": "node1", "complete": True,
                "logs": [{"path": layout.log_copy("/run/train.log"), "source": "/run/train.log"}],
                "processes": []}
    if network:
        (root / network).parent.mkdir(parents=True)
        (root / network).write_text(json.dumps([{"master_addr": "node1", "master_port": 29500,
                                                 "listening_here": True, "holder_pid": 7}]))
        manifest["network"] = network
    manifest["summaries"] = summaries.write(root)
    (root / layout.MANIFEST).write_text(json.dumps(manifest))
    return root


def test_a_current_summary_is_read_instead_of_the_raw_log(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    (root / layout.log_copy("/run/train.log")).write_text("epoch 1 loss 0.5\n")
    analysis = run(load([root]))
    assert analysis.verdict is not None and analysis.verdict.cause == "port_in_use"


def test_a_stale_summary_is_ignored_with_a_note(tmp_path: Path) -> None:
    for key, value in (("catalog", "0123456789abcdef"), ("tool_version", "0.0.1")):
        root = _bundle(tmp_path / key)
        (root / layout.log_copy("/run/train.log")).write_text("epoch 1 loss 0.5\n")
        manifest = json.loads((root / layout.MANIFEST).read_text())
        manifest["summaries"][key] = value
        (root / layout.MANIFEST).write_text(json.dumps(manifest))
        job = load([root])
        assert run(job).verdict is None, key  # the raw log (healthy now) was read
        assert any("summary made by another version" in n.message for n in job.notes), key


def test_the_reader_follows_the_manifests_pointers(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b", network="elsewhere/probes.json")
    [bundle] = load([root]).bundles
    assert bundle.probes and bundle.probes[0]["holder_pid"] == 7
