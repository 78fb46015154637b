"""The rule registry as a whole: documentation, codes, examples that fire, near-misses that don't."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules import catalog
from ddp_autopsy.rules.base import CAUSES, DOC_SECTIONS
from ddp_autopsy.rules.engine import registry, run

RULES = registry()
NEAR_MISS = Path(__file__).parent / "rules" / "near_miss"


def test_registry_is_not_empty_and_codes_are_unique() -> None:
    codes = [r.code for r in RULES]
    slugs = [r.slug for r in RULES]
    assert len(codes) >= 10
    assert len(set(codes)) == len(codes)
    assert len(set(slugs)) == len(slugs)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_module_is_named_after_code_and_slug(rule) -> None:
    module = rule.__module__.rsplit(".", 1)[-1]
    assert module == f"{rule.code.lower()}_{rule.slug.replace('-', '_')}"
    assert re.fullmatch(r"[A-Z]+\d{3}", rule.code)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_docstring_has_every_section(rule) -> None:
    sections = rule.sections()
    for name in DOC_SECTIONS:
        assert sections.get(name, "").strip(), f"{rule.code}: empty or missing '## {name}'"
    assert rule.title() and not rule.title().startswith("#")
    assert rule.cause is None or rule.cause in CAUSES
    assert (rule.cause is None) == (rule.role in ("symptom", "info"))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_doc_example_fires(rule, tmp_path: Path) -> None:
    for name, data in rule.example_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    analysis = run(load([tmp_path]))
    codes = {f.rule for f in analysis.findings}
    assert rule.code in codes, f"{rule.code}: its own Example does not fire it ({codes})"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_near_miss_does_not_fire(rule) -> None:
    case = NEAR_MISS / rule.code
    assert case.is_dir() and any(case.iterdir()), f"{rule.code}: no near-miss case in {case}"
    analysis = run(load([case]))
    fired = [f for f in analysis.findings if f.rule == rule.code and f.role != "info"]
    assert not fired, f"{rule.code} fired on its near-miss: {fired[0].summary}"
    # It must have looked and found nothing: a rule that errored or lacked its inputs proves
    # nothing about the near-miss.
    outcome = next(o for o in analysis.outcomes if o.rule == rule.code)
    assert outcome.status in ("ruled_out", "finding"), (rule.code, outcome.to_dict())


def test_generated_docs_are_current() -> None:
    stale = [p for p, text in catalog.expected_files().items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    assert not stale, "run `python -m ddp_autopsy.rules.catalog` to regenerate: " + ", ".join(
        map(str, stale))
