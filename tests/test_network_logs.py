"""NCCL004 from per-node logs alone: which node a link cut isolated (issue #15's link_drop)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

CASE = Path(__file__).parent / "rules" / "cases" / "NCCL004-launcher-silent-one-node"


def _findings(root: Path) -> list:
    analysis = run(load(sorted(root.glob("node-*/console.log"))))
    return [f for f in analysis.findings if f.rule == "NCCL004"]


def test_silent_launcher_names_its_node() -> None:
    (found,) = _findings(CASE)
    assert found.ranks == [2, 3]
    assert found.hosts == ["node-1"]


def test_every_launcher_reporting_names_no_node(tmp_path: Path) -> None:
    """The same job with node-1's launcher reporting its workers' failure like the others
    (the lines node-2's launcher printed, with node-1's ranks): nothing tells the cut node, so
    the verdict stays the all-stalled network suspicion over every host."""
    shutil.copytree(CASE, tmp_path / "job")
    node2 = (tmp_path / "job" / "node-2" / "console.log").read_text()
    report = node2[node2.index("E1124 06:04:11.725000"):]
    report = (report.replace("node-2", "node-1").replace("rank      : 5", "rank      : 3")
              .replace("rank      : 4", "rank      : 2"))
    with (tmp_path / "job" / "node-1" / "console.log").open("a") as out:
        out.write(report)
    (found,) = _findings(tmp_path / "job")
    assert found.ranks == []
    assert found.hosts == ["node-0", "node-1", "node-2", "node-3"]
