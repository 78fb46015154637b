"""The derived-facts layer (analyzer/facts.py): one home, built once, declared by the rules, and
data flowing one way (collectors → analyzer → rules → reports)."""

from __future__ import annotations

import ast
import doctest
import importlib
import io
from pathlib import Path

import pytest
from test_html_report import write_hang

from ddp_autopsy.analyzer.facts import FACTS, KNOWN
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.reports import html, json_report, text
from ddp_autopsy.rules.base import Rule
from ddp_autopsy.rules.engine import registry, run

PACKAGE = Path(__file__).resolve().parents[1] / "ddp_autopsy"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, absolute (relative imports resolved), at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(parts[: len(parts) - node.level] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize(("part", "forbidden"), [
    ("analyzer", ("ddp_autopsy.rules", "ddp_autopsy.reports", "ddp_autopsy.collectors")),
    ("rules", ("ddp_autopsy.reports", "ddp_autopsy.collectors")),
    ("reports", ("ddp_autopsy.collectors",)),
])
def test_data_flows_one_way(part: str, forbidden: tuple[str, ...]) -> None:
    bad = [f"{p.relative_to(PACKAGE)} imports {m}"
           for p in sorted((PACKAGE / part).rglob("*.py")) for m in sorted(_imports(p))
           if m.startswith(forbidden)]
    assert not bad, "\n".join(bad)


def test_import_check_can_fail(tmp_path: Path) -> None:
    probe = PACKAGE / "analyzer" / "stacktree.py"
    assert "ddp_autopsy.analyzer.ranksets" in _imports(probe)
    assert any(m.startswith("ddp_autopsy.rules") for m in _imports(PACKAGE / "reports" / "text.py"))


@pytest.mark.parametrize("rule", registry(), ids=lambda r: r.code)
def test_rules_declare_known_names(rule: type[Rule]) -> None:
    unknown = set(rule.requires) | set(rule.optional)
    assert unknown <= KNOWN, f"{rule.code} declares unknown names {sorted(unknown - KNOWN)}"


def test_a_rule_missing_a_fact_is_not_evaluated_never_ruled_out(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("epoch 1 loss 0.5\n")

    class NeedsStacks(Rule):
        code, slug = "TEST001", "needs-stacks"
        requires = ("events", "stack_tree")

        def check(self, job):  # pragma: no cover - must not be called
            raise AssertionError("called without its fact")

    analysis = run(load([tmp_path]), rules=(NeedsStacks,))
    [outcome] = analysis.outcomes
    assert outcome.status == "not_evaluated" and outcome.missing == ["stack_tree"]


def test_each_fact_is_built_once_per_analysis(tmp_path: Path) -> None:
    """analyze --html --format json and the terminal view of one job: every fact once."""
    analysis = run(load([write_hang(tmp_path / "hang")]))
    html.render(analysis)
    json_report.render(analysis)
    text.render(analysis, out=io.StringIO(), color=False)
    builds = analysis.job.fact_builds
    assert set(builds) == set(FACTS), builds
    assert all(n == 1 for n in builds.values()), builds


def test_replacing_a_frame_rebuilds_the_facts(tmp_path: Path) -> None:
    job = load([write_hang(tmp_path / "hang")])
    assert job.rank_state.filter(state="failed").height == 3
    job.events = job.events.clear()
    assert job.rank_state.filter(state="failed").height == 0
    assert job.fact_builds["rank_state"] == 2


def test_the_per_rank_table(tmp_path: Path) -> None:
    job = load([write_hang(tmp_path / "hang")])
    table = {r["rank"]: r for r in job.rank_state.iter_rows(named=True)}
    assert table[2]["state"] == "busy" and "train.py" in table[2]["frame"]
    assert {table[r]["state"] for r in (0, 1, 3)} == {"failed"}
    assert {table[r]["collective"] for r in (0, 1, 3)} == {"all_reduce"}
    assert table[0]["seq"] == 12  # from its watchdog timeout


DUPLICATE_GPU = "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"
TORCHRUN_START = ("W0412 08:03:11.115000 2521679 torch/distributed/run.py:792] Setting "
                  "OMP_NUM_THREADS environment variable for each process to be 1 in default, "
                  "to avoid your system being overloaded, please further tune the variable for "
                  "optimal performance in your application as needed.")


def test_a_clean_restart_makes_any_earlier_failure_history(tmp_path: Path) -> None:
    """The history policy is the default for every rule (NCCL002 used to skip it)."""
    failed = [TORCHRUN_START, f"node1:12:34 [1] init.cc:1234 {DUPLICATE_GPU}"]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "console.log").write_text("\n".join(failed) + "\n")
    assert run(load([tmp_path / "a"])).verdict.rule == "NCCL002"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "console.log").write_text(
        "\n".join([*failed, TORCHRUN_START, "epoch 1 step 10 loss 2.31"]) + "\n")
    analysis = run(load([tmp_path / "b"]))
    assert analysis.verdict is None
    assert analysis.job.rows("duplicate_gpu") == []
    assert len(analysis.job.rows("duplicate_gpu", history=True)) == 1


def _modules_with_doctests() -> list[str]:
    out = []
    for p in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in p.read_text(encoding="utf-8") and "demo" not in p.parts:
            out.append(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts))
    return out


@pytest.mark.parametrize("name", _modules_with_doctests())
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
