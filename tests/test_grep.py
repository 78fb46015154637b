"""`ddp-autopsy grep`: every line stays searchable — classified or not — with its rank, in any
layout, archives read in place."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from ddp_autopsy.analyzer.flight_recorder import example_dumps
from ddp_autopsy.analyzer.grep import check_pattern, grep


def _inputs(root: Path) -> Path:
    logs = root / "logs"
    (logs / "per-rank").mkdir(parents=True)
    (logs / "per-rank" / "rank3.log").write_text("epoch 1 batch 17 loss nan\nepoch 1 done\n")
    (logs / "console.log").write_text("[rank0]: epoch 1 batch 17 loss 0.5\n"
                                      "[rank1]: epoch 1 batch 17 loss 0.4\nunrelated\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"[rank5]: epoch 1 batch 17 loss 0.3\n"
        info = tarfile.TarInfo("node2/console.log")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    (logs / "node2.tar.gz").write_bytes(buf.getvalue())
    (logs / "fr").mkdir()
    for name, blob in example_dumps("rank 0: #17 all_reduce [[4]] Float completed").items():
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_bytes(blob)  # a pickle mentioning 17: not lines
    return logs


def test_lines_no_pattern_classifies_are_found_with_their_rank(tmp_path: Path) -> None:
    logs = _inputs(tmp_path)
    hits = list(grep([logs], r"batch 17", []))
    assert sorted((h.rank, Path(h.path.split("!")[0]).name, h.line) for h in hits) == [
        (0, "console.log", 1), (1, "console.log", 2), (3, "rank3.log", 1),
        (5, "node2.tar.gz", 1)]
    assert [h.rank for h in grep([logs], r"batch 17", [], rank=3)] == [3]


def test_cli_text_json_and_exit_codes(tmp_path: Path) -> None:
    logs = _inputs(tmp_path)
    cmd = [sys.executable, "-m", "ddp_autopsy", "grep"]
    text = subprocess.run([*cmd, "LOSS NAN", str(logs), "-i"], capture_output=True, text=True)
    assert text.returncode == 0
    assert text.stdout.strip() == f"{logs / 'per-rank' / 'rank3.log'}:1 [rank 3]: epoch 1 batch " \
                                  "17 loss nan"
    doc = json.loads(subprocess.run([*cmd, "batch 17", str(logs), "--format", "json", "--max",
                                     "2"], capture_output=True, text=True, check=True).stdout)
    assert doc["schema"] == "ddp-autopsy/grep/1" and len(doc["hits"]) == 2
    assert any("--max" in n["message"] for n in doc["notes"])
    assert subprocess.run([*cmd, "no such words", str(logs)]).returncode == 1
    bad = subprocess.run([*cmd, "batch (17", str(logs)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a usable regex" in bad.stderr


def test_check_pattern() -> None:
    assert check_pattern(r"loss (nan|inf)") is None
    assert check_pattern("(unclosed") is not None
