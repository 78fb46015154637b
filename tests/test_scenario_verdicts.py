"""End to end on real jobs: each scenario of the library (tests/scenarios/) is a real torchrun /
mp.spawn / per-process job on CPU with Gloo, failing in one known way. Analyze what a user would
have — the console output and torchrun's --log-dir, or the bundle `collect` took of a hung job —
and check the verdict, the culprit ranks and the evidence."""

from __future__ import annotations

from pathlib import Path

import pytest
from scenarios.runner import SCENARIOS, ScenarioRun

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import Analysis, run

NAMES = sorted(SCENARIOS)


def user_inputs(sr: ScenarioRun) -> list[Path]:
    if sr.bundle is not None:
        return [sr.bundle]
    paths = [sr.console, *sr.rank_files()]
    if sr.log_dir is not None and sr.log_dir.is_dir():
        paths.append(sr.log_dir)
    return paths


def analyze(sr: ScenarioRun) -> Analysis:
    assert sr.error is None, f"{sr.name}: the scenario itself went wrong: {sr.error}"
    return run(load(user_inputs(sr)))


@pytest.mark.scenario
@pytest.mark.parametrize("name", NAMES)
def test_verdict(name: str, scenario_run) -> None:
    sr = scenario_run(name)
    expect = sr.expect
    analysis = analyze(sr)
    verdict = analysis.verdict
    found = [(f.role, f.cause, f.ranks, f.summary) for f in analysis.findings]
    if expect["cause"] is None:
        assert verdict is None, f"{name}: near-miss got a verdict: {verdict.summary}\n{found}"
        return
    assert verdict is not None, f"{name}: no verdict; findings: {found}"
    assert verdict.cause == expect["cause"], f"{name}: {verdict.summary}\n{found}"
    if expect.get("ranks"):
        assert verdict.ranks == expect["ranks"], f"{name}: {verdict.summary}"
    for key in ("frame", "site", "op", "host", "signal"):
        if key in expect:
            assert expect[key] in verdict.summary, f"{name}: {key} {expect[key]!r} not in " \
                                                   f"{verdict.summary!r}"
    if "exception" in expect:
        assert expect["exception"] in verdict.summary
    assert verdict.evidence, f"{name}: a verdict without evidence"
    for ev in verdict.evidence:
        assert Path(ev.path.split("!")[0]).exists()
        if ev.line is not None:
            lines = Path(ev.path).read_text(errors="replace").splitlines()
            assert lines[ev.line - 1].strip().startswith(ev.text.strip()[:60]), (
                f"{name}: evidence {ev.location} does not quote its line")


@pytest.mark.scenario("rank_crash_exception")
def test_crash_symptoms_point_at_the_crash(scenario_run) -> None:
    analysis = analyze(scenario_run("rank_crash_exception"))
    verdict = analysis.verdict
    # The traceback names no host; torchelastic's failure summary for that rank does.
    entry = next(e for e in verdict.evidence if e.host)
    assert verdict.hosts == [entry.host]
    symptoms = [f for f in analysis.findings if f.role == "symptom"]
    assert any(f.rule == "SYM002" for f in symptoms), "peer-closed errors of ranks 0-1 missing"
    assert all(f.explained_by == verdict.id for f in symptoms)
    peer = next(f for f in symptoms if f.rule == "SYM002")
    assert set(peer.ranks) <= {0, 1}


HANGS = sorted(name for name, spec in SCENARIOS.items() if spec.hang)


@pytest.mark.scenario
@pytest.mark.parametrize("name", HANGS)
def test_bundle_summaries_match_the_raw_logs(name: str, scenario_run) -> None:
    """collect pre-parses the logs it copies (summaries/events.parquet); analyzing the summary
    must give what re-reading the raw logs gives."""
    sr = scenario_run(name)
    fast, raw = load([sr.bundle]), load([sr.bundle], use_summaries=False)
    assert fast.bundles[0].manifest.get("summaries"), "collect wrote no summaries"
    cols = ["source", "line", "kind", "rank", "text"]
    assert fast.events.select(cols).sort("source", "line", "kind").equals(
        raw.events.select(cols).sort("source", "line", "kind"))
    assert sorted((i.path, i.lines) for i in fast.inputs if i.kind == "log") == \
        sorted((i.path, i.lines) for i in raw.inputs if i.kind == "log")
    a, b = (run(j).verdict for j in (fast, raw))
    assert (a.cause, a.ranks) == (b.cause, b.ranks) if a and b else a is b is None
