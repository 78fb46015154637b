"""Bundle actions: timeouts, deadlines and the tarball (collectors/bundle.py, collect.tar_bundle)."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time
from pathlib import Path

from ddp_autopsy.collectors import bundle as bundle_mod
from ddp_autopsy.collectors.collect import tar_bundle


def test_run_command_timeout_kills_and_keeps_partial_output() -> None:
    start = time.monotonic()
    res = bundle_mod.run_command(
        [sys.executable, "-c", "import time; print('partial', flush=True); time.sleep(60)"], 1.5)
    assert res.timeout_hit and res.stdout.strip() == b"partial"
    assert time.monotonic() - start < 8


def test_probe_timeout_and_deadline_are_recorded(tmp_path: Path) -> None:
    b = bundle_mod.Bundle(tmp_path / "b", bundle_mod.Deadline(30))
    out = b.probe("slow", lambda: time.sleep(5), target="t", step_timeout=0.2, path="slow.json")
    assert out is not None and not out.done
    action = b.actions[-1]
    assert action.status == "timeout" and action.timeout_hit and action.path is None
    assert not (tmp_path / "b" / "slow.json").exists()
    missing = b.command("nope", ["/nonexistent/tool"], target="host", path="x.txt",
                        step_timeout=1)
    assert missing is not None and b.actions[-1].status == "absent"
    expired = bundle_mod.Bundle(tmp_path / "c", bundle_mod.Deadline(0))
    assert expired.command("late", ["true"], target=None, path=None, step_timeout=5) is None
    assert expired.actions[-1].status == "skipped" and expired.actions[-1].timeout_hit is False
    manifest = expired.write_manifest(complete=False, duration_s=0.0)
    assert json.loads((tmp_path / "c" / "manifest.json").read_text()) == manifest


def test_tar_stops_at_the_deadline_and_removes_the_partial_archive(tmp_path: Path) -> None:
    root = tmp_path / "b"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "big.bin").write_bytes(os.urandom(32 << 20))  # ~0.3 s of gzip, or more
    b = bundle_mod.Bundle(root, bundle_mod.Deadline(0.1))
    start = time.monotonic()
    assert tar_bundle(b) is None
    assert time.monotonic() - start < 0.1 + 1.0  # stopped itself, within the deadline + slack
    tar = b.manifest["tar"]
    assert tar["path"] == "b.tar.gz" and tar["status"] == "timeout" and tar["total"] == 1
    assert tar["files"] == 0 and "partial archive removed" in tar["error"]
    action = b.actions[-1]
    assert action.name == "tar" and action.timeout_hit and action.path is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no archive, no temp file


def test_tar_after_the_deadline_is_skipped_and_within_it_complete(tmp_path: Path) -> None:
    root = tmp_path / "b"
    (root / "processes" / "1").mkdir(parents=True)
    (root / "processes" / "1" / "info.json").write_text("{}")
    (root / ".manifest.json.1.tmp").write_text("")  # a temp file is never archived
    late = bundle_mod.Bundle(root, bundle_mod.Deadline(0))
    assert tar_bundle(late) is None and late.manifest["tar"]["status"] == "skipped"
    assert late.actions[-1].status == "skipped" and not (tmp_path / "b.tar.gz").exists()
    b = bundle_mod.Bundle(root, bundle_mod.Deadline(30))
    tarball = tar_bundle(b)
    assert tarball == tmp_path / "b.tar.gz" and b.manifest["tar"]["status"] == "ok"
    assert b.manifest["tar"]["files"] == b.manifest["tar"]["total"] == 1
    with tarfile.open(tarball) as tar:
        assert tar.getnames() == ["b", "b/processes", "b/processes/1",
                                  "b/processes/1/info.json"]
