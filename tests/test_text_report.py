"""The terminal report as ``ddp-autopsy analyze`` prints it (reports/text.py): the merged stack
tree with rank ranges, and the outlier pointed at.

The CLI runs as a user would run it (``python -m ddp_autopsy analyze``, stdout not a terminal), on
the fixture hang of test_html_report.py and on the bundle ``collect`` took of the real
``stuck_in_eval`` job.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_html_report import PROBE, write_hang

BRANCH = re.compile(r"^[│ ]*[├└]── (?P<label>.+)$")


def analyze_cli(*paths: Path) -> str:
    env = {**os.environ, "COLUMNS": "160", "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([sys.executable, "-m", "ddp_autopsy", "analyze", "--no-color",
                           *map(str, paths)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def tree_of(out: str) -> tuple[list[str], dict[str, list[str]]]:
    """The main-thread tree printed after "Where the ranks are": its lines, and each branch's
    lines (its label, then its frames and "● N here") by label."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Where the ranks are: "))
    tree = []
    for line in lines[start:]:
        if not line.strip() or line.startswith(("Other threads", "Agent processes",
                                                "Dataloader processes")):
            break
        tree.append(line)
    branches: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in tree:
        m = BRANCH.match(line)
        if m:
            current = branches.setdefault(m["label"], [])
        elif current is not None:
            current.append(line.strip(" │"))
    return tree, branches


def test_fixture_hang_prints_the_tree_and_points_at_the_outlier(tmp_path: Path) -> None:
    out = analyze_cli(write_hang(tmp_path / "job"))
    tree, branches = tree_of(out)
    assert tree[0] == "Where the ranks are: 4 processes in 2 distinct stacks"
    assert tree[1] == f"Outlier: rank 2 in {PROBE} (train.py:31)"  # log text, literally
    assert tree[2] == "ranks 0-3  4" and tree[3].strip() == "<module>  train.py:60"
    assert list(branches) == ["ranks 0-1,3  3", "rank 2  1  OUTLIER"]
    assert branches["ranks 0-1,3  3"] == [
        "main  train.py:48", "wrapper  torch/distributed/c10d_logger.py:83",
        "all_reduce  torch/distributed/distributed_c10d.py:3252",
        "● 3 here, waiting in all_reduce (3 idle)"]
    assert branches["rank 2  1  OUTLIER"] == [
        "main  train.py:52", "evaluate  train.py:30", f"{PROBE}  train.py:31",
        "● 1 here, evaluation (1 idle)"]
    assert 'thread "pin_memory" · ranks 0-3  4' in out  # other threads, their own tree


@pytest.mark.scenario("stuck_in_eval")
def test_real_hang_prints_the_tree_and_points_at_the_outlier(
        scenario_run: Callable[[str], Any]) -> None:
    run = scenario_run("stuck_in_eval")
    assert run.bundle is not None, run.error
    out = analyze_cli(run.bundle, run.console)
    assert out.index("VERDICT") < out.index("Where the ranks are")
    tree, branches = tree_of(out)
    assert tree[0] == "Where the ranks are: 3 processes in 2 distinct stacks"
    assert re.fullmatch(r"Outlier: rank 0 in evaluate \(\S*stuck_in_eval\.py:\d+\)", tree[1])
    assert tree[2] == "ranks 0-2  3"
    assert list(branches) == ["ranks 1-2  2", "rank 0  1  OUTLIER"]
    waiting, outlier = branches["ranks 1-2  2"], branches["rank 0  1  OUTLIER"]
    assert waiting[-2].startswith("all_reduce  torch/distributed/distributed_c10d.py:")
    assert waiting[-1] == "● 2 here, waiting in all_reduce (2 idle)"
    assert re.fullmatch(r"evaluate  \S*stuck_in_eval\.py:\d+", outlier[-2])
    assert outlier[-1] == "● 1 here, evaluation (1 idle)"
    assert re.search(r"^Agent processes: pid \d+, 1 distinct stack", out, re.M)


def test_the_per_rank_table_collapses_ranks_and_marks_the_culprit(tmp_path: Path) -> None:
    out = analyze_cli(write_hang(tmp_path / "hang", world=6, odd=2))
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("Ranks (")))
    assert lines[start].startswith("Ranks (6")
    rows = lines[start + 1:start + 3]
    assert re.match(r"^  rank 2 +busy +.*train\.py", rows[0]), rows  # the culprit first
    assert re.match(r"^  ranks 0-1,3-5 +failed +all_reduce #12", rows[1]), rows
