"""The JSON report's layout (reports/json_report.layout): the same document as json.dumps, small
objects on one line, long arrays one element a line, written by the C encoder."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.reports import json_report
from ddp_autopsy.rules.engine import run

CASES = Path(__file__).parent / "rules" / "cases"

ODD = {
    "empty": [{}, [], "", None],
    3: "an int key", True: "a bool key", None: "a None key", 2.5: "a float key",
    "when": datetime(2024, 5, 1, 12, 0, 1),  # default=str
    "text": "é \u2028 \x1b[31m \"quoted\" \\",
    "nan": float("nan"),
    "long numbers": list(range(40)),
    "long objects": [{"rank": r, "host": f"node{r}", "deep": {"a": [r]}} for r in range(20)],
    "deep": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": list(range(30))}}}}}}}},
    "wide": {"k" * 40: "v" * 40, "k2": ["x" * 30, "y" * 30]},
}


def test_same_document_as_json_dumps_for_odd_values() -> None:
    text = json_report.layout(ODD)
    assert text == text.strip()
    assert json.loads(text) == json.loads(json.dumps(ODD, default=str)) \
        or json.dumps(json.loads(text), sort_keys=True) == json.dumps(
            json.loads(json.dumps(ODD, default=str)), sort_keys=True)  # (NaN != NaN)


def test_shape() -> None:
    lines = json_report.layout(ODD).splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert '  "empty": [{}, [], "", null],' in lines  # fits: one line
    assert '  "long numbers": [' + ", ".join(map(str, range(40))) + "]," in lines
    objects = [ln for ln in lines if ln.startswith('    {"rank": ')]
    assert len(objects) == 20  # a long array of objects: one a line
    assert '  "3": "an int key",' in lines and '  "true": "a bool key",' in lines and '  "null": "a None key",' in lines
    # the wide object did not fit in 100 columns: one member a line
    assert any(ln.startswith('    "' + "k" * 40) for ln in lines)


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir())[:40])
def test_reports_of_rule_cases_parse_as_before(case: str) -> None:
    analysis = run(load([CASES / case]))
    text = json_report.render(analysis)
    assert json.loads(text) == json.loads(json.dumps(json_report.to_dict(analysis), default=str))
    # every line that is a whole small object or array stays within the width
    for ln in text.splitlines():
        body = ln.strip().rstrip(",")
        if body.startswith("{") and body.endswith("}") and len(ln) > json_report.WIDTH:
            depth = (len(ln) - len(ln.lstrip())) // 2
            assert depth >= 2, ln  # only elements of a long array may run over
