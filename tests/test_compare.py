"""``ddp-autopsy compare A B``: verdicts, versions and environment, ranks, findings new and
gone; on bundles in collect's layout, and on a real collected bundle against an altered copy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.cli import main

SCHEMA = json.loads((Path(__file__).parents[1] / "ddp_autopsy" / "schemas"
                     / "compare.schema.json").read_text())


def _bundle(root: Path, torch: str, stuck_rank: int | None) -> Path:
    """A bundle of a 3-rank job: versions per process, each worker's log; ``stuck_rank``
    logs a crash (the others time out in all_reduce)."""
    root.mkdir(parents=True)
    procs, logs = [], []
    for rank in range(3):
        pid = 500 + rank
        info = {"env": {"RANK": str(rank), "NCCL_DEBUG": "INFO"},
                "versions": {"torch": torch, "python": "3.11.7"}}
        (root / layout.process_info(pid)).parent.mkdir(parents=True, exist_ok=True)
        (root / layout.process_info(pid)).write_text(json.dumps(info))
        procs.append({"pid": pid, "role": "worker", "rank": rank, "local_rank": rank,
                      "info": layout.process_info(pid)})
        path = layout.log_copy(f"/job/rank{rank}.log")
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        text = f"[rank{rank}]: step 10\n"
        if rank == stuck_rank:
            text += (f"[rank{rank}]: Traceback (most recent call last):\n"
                     f'[rank{rank}]:   File "train.py", line 12, in <module>\n'
                     f"[rank{rank}]: ValueError: bad batch\n")
        (root / path).write_text(text)
        logs.append({"path": path, "pid": pid})
    (root / layout.MANIFEST).write_text(json.dumps({
        "schema": layout.SCHEMA, "host": "node1", "complete": True, "processes": procs,
        "logs": logs}))
    return root


def test_compare_two_bundles(tmp_path: Path) -> None:
    a = _bundle(tmp_path / "a", "2.3.1", stuck_rank=None)
    b = _bundle(tmp_path / "b", "2.4.0", stuck_rank=1)
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema"] == "ddp-autopsy/compare/1"
    assert doc["verdict"]["a"] is None and doc["verdict"]["b"]["ranks"] == [1]
    assert not doc["verdict"]["same"]
    env = {e["key"]: (e["a"], e["b"]) for e in doc["env"]}
    assert env == {"version.torch": (["2.3.1"], ["2.4.0"])}  # python, NCCL_DEBUG the same
    assert [r["rank"] for r in doc["ranks"]] == [1]
    assert doc["ranks"][0]["b"]["state"] == "crashed"
    assert any(f["rule"] == doc["verdict"]["b"]["rule"] for f in doc["findings"]["new"])
    assert doc["findings"]["gone"] == []
    text = CliRunner().invoke(main, ["compare", str(a), str(b)]).output
    assert "Verdict differs" in text and "version.torch: A 2.3.1  B 2.4.0" in text
    assert "rank 1: A seen" in text and "->  B crashed" in text
    # Swapped: the crash is gone, nothing is new.
    back = json.loads(CliRunner().invoke(main, ["compare", str(b), str(a), "--format",
                                                "json"]).output)
    assert back["findings"]["new"] == [] and back["findings"]["gone"]
    jsonschema.validate(back, SCHEMA)


def test_compare_same_run_and_unreadable(tmp_path: Path) -> None:
    a = _bundle(tmp_path / "a", "2.3.1", stuck_rank=2)
    text = CliRunner().invoke(main, ["compare", str(a), str(a)]).output
    assert "Verdict: the same in both" in text
    assert "no difference seen" in text and "every rank in the same state" in text
    res = CliRunner().invoke(main, ["compare", str(a), str(tmp_path / "nope")])
    assert res.exit_code == 3 and "does not exist" in res.output


@pytest.mark.scenario
def test_compare_real_bundles(tmp_path: Path) -> None:
    """Real hung mp.spawn jobs, collected: two runs at different world sizes; and one
    compared with a copy whose torch version was changed, as a rerun on another image."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent))
    import collect_helpers as h

    def collected(nprocs: int, out: Path) -> None:
        job = h.start_spawn(tmp_path / f"spawn{nprocs}", nprocs)
        try:
            job.wait_ready(nprocs, 120)
            res = subprocess.run([sys.executable, "-c", "import sys; from ddp_autopsy.cli "
                                  "import main; main(sys.argv[1:], prog_name='ddp-autopsy')",
                                  "collect", "--pid", str(job.pid), "--out", str(out)],
                                 capture_output=True, text=True, timeout=180)
        finally:
            job.stop()
        assert res.returncode == 0, res.stderr

    collected(2, tmp_path / "a")
    # Two real bundles: the same hang at world size 2 and 3 (rank 1 in evaluate each time;
    # rank 2, waiting in all_reduce, exists in the second run only).
    collected(3, tmp_path / "c")
    res = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "c"),
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["verdict"]["same"] and doc["verdict"]["a"]["ranks"] == [1], doc["verdict"]
    assert [(r["rank"], r["a"]["state"], r["b"]["state"]) for r in doc["ranks"]] == [
        (2, None, "waiting")], doc["ranks"]
    job_file = Path(__file__).parent / "collect_jobs" / "hang_allreduce.py"
    wait_line = job_file.read_text().splitlines().index(
        "    dist.all_reduce(torch.ones(1))") + 1
    assert doc["ranks"][0]["b"]["frame"] == f"run (hang_allreduce.py:{wait_line})"  # its own
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, b)
    changed = 0
    for info in b.glob("processes/*/info.json"):
        doc = json.loads(info.read_text())
        if (doc.get("versions") or {}).get("torch"):
            doc["versions"]["torch"] = "9.9.9"
            info.write_text(json.dumps(doc))
            changed += 1
    assert changed
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    jsonschema.validate(doc, SCHEMA)
    torch = next(e for e in doc["env"] if e["key"] == "version.torch")
    assert torch["b"] == ["9.9.9"] and torch["a"] and "9.9.9" not in torch["a"]
    assert doc["verdict"]["same"] and doc["ranks"] == []
