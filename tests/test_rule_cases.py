"""Cases beyond each rule's own Example and near-miss: ``tests/rules/cases/<CODE>-<name>/`` must
fire rule CODE (with the cause and ranks its ``expect.json`` names), ``tests/rules/near_miss/
<CODE>-<name>/`` must not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

RULES = Path(__file__).parent / "rules"
FIRE = sorted(p for p in (RULES / "cases").glob("*-*") if (p / "expect.json").exists())
QUIET = sorted(p for p in (RULES / "near_miss").glob("*-*") if (p / "expect.json").exists())


def _inputs(case: Path) -> list[Path]:
    return [p for p in case.iterdir() if p.name != "expect.json"]


@pytest.mark.parametrize("case", FIRE, ids=lambda p: p.name)
def test_case_fires(case: Path) -> None:
    expect = json.loads((case / "expect.json").read_text())
    analysis = run(load(_inputs(case)))
    found = [f for f in analysis.findings if f.rule == expect["rule"]]
    assert found, f"{expect['rule']} did not fire: {[f.summary for f in analysis.findings]}"
    if "cause" in expect:
        assert analysis.verdict is not None and analysis.verdict.cause == expect["cause"], \
            analysis.verdict
    if "ranks" in expect:
        assert found[0].ranks == expect["ranks"]


@pytest.mark.parametrize("case", QUIET, ids=lambda p: p.name)
def test_near_miss_stays_quiet(case: Path) -> None:
    expect = json.loads((case / "expect.json").read_text())
    analysis = run(load(_inputs(case)))
    fired = [f.summary for f in analysis.findings if f.rule == expect["rule"] and f.role != "info"]
    assert not fired, fired
