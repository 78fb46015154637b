"""Outputs for CI systems: SARIF 2.1.0, JUnit XML and GitHub Actions annotations, and the
``--fail-on`` gate (docs/ci.md).

Each finding is one result (SARIF), one failure of its rule's test case (JUnit) or one
annotation (GitHub); its evidence lines are its locations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree as ET

from ddp_autopsy import __version__
from ddp_autopsy.rules.base import Evidence, Finding
from ddp_autopsy.rules.engine import Analysis

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

#: ``--fail-on`` thresholds, in order of strictness.
FAIL_ON = ("root_cause", "error", "warning")
_RANK = {"critical": 3, "error": 2, "warning": 1, "info": 0}


def gate(analysis: Analysis, fail_on: str | None) -> list[Finding]:
    """The findings that trip ``--fail-on``: ``root_cause`` any root cause; ``error`` any
    finding of severity error or critical; ``warning`` any of severity warning or above."""
    if fail_on is None:
        return []
    if fail_on == "root_cause":
        return [f for f in analysis.findings if f.role == "root_cause"]
    floor = _RANK["error" if fail_on == "error" else "warning"]
    return [f for f in analysis.findings if _RANK.get(f.severity, 0) >= floor]


def _level(severity: str) -> str:
    return {"critical": "error", "error": "error", "warning": "warning"}.get(severity, "note")


def _uri(path: str) -> str:
    """A relative URI reference for an input path (an archive member stays ``a.tgz!m``)."""
    return quote(path.replace("\\", "/"), safe="/!._-~")


def _location(ev: Evidence) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(ev.path)}}
    if ev.line is not None and ev.line >= 1:
        physical["region"] = {"startLine": ev.line, "snippet": {"text": ev.text}}
    loc: dict[str, Any] = {"physicalLocation": physical}
    who = [f"rank {ev.rank}"] if ev.rank is not None else []
    who += [f"host {ev.host}"] if ev.host else []
    loc["message"] = {"text": (", ".join(who) + ": " if who else "") + ev.text.strip()}
    return loc


def _rules(analysis: Analysis) -> list[tuple[str, str, str]]:
    """(code, slug, title) of every rule that produced a finding, in order of first finding."""
    from ddp_autopsy.rules.engine import get_rule

    seen: dict[str, tuple[str, str, str]] = {}
    for f in analysis.findings:
        if f.rule not in seen:
            rule = get_rule(f.rule)
            seen[f.rule] = (f.rule, f.slug, rule.title() if rule else f.slug)
    return list(seen.values())


def sarif(analysis: Analysis) -> dict[str, Any]:
    """The SARIF 2.1.0 log: one run, one result per finding."""
    rules = _rules(analysis)
    index = {code: i for i, (code, _, _) in enumerate(rules)}
    results = []
    for f in analysis.findings:
        result: dict[str, Any] = {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": _level(f.severity),
            "message": {"text": f"{f.summary}\nRemedy: {f.remedy}" if f.remedy else f.summary},
            "locations": [_location(ev) for ev in f.evidence],
            "properties": {"id": f.id, "role": f.role, "cause": f.cause,
                           "severity": f.severity, "confidence": round(f.confidence, 3),
                           "ranks": sorted(set(f.ranks)), "hosts": sorted(set(f.hosts)),
                           "explainedBy": f.explained_by},
        }
        if f.role == "info":
            result["kind"] = "informational"
            result["level"] = "none"
        results.append(result)
    driver = {
        "name": "ddp-autopsy",
        "version": __version__,
        "rules": [{"id": code, "name": slug, "shortDescription": {"text": title},
                   "help": {"text": f"ddp-autopsy rule {code} (docs/rules/{code}.md)"}}
                  for code, slug, title in rules],
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": driver}, "results": results}]}


def render_sarif(analysis: Analysis) -> str:
    return json.dumps(sarif(analysis), indent=2, default=str)


def _failure_text(findings: Iterable[Finding]) -> str:
    out = []
    for f in findings:
        out.append(f"{f.id} [{f.role}] {f.summary}")
        out += [f"  {ev.location}  {ev.text.strip()}" for ev in f.evidence]
        if f.remedy:
            out.append(f"  remedy: {f.remedy}")
    return "\n".join(out)


def render_junit(analysis: Analysis) -> str:
    """JUnit XML: one test case per rule; a rule with a root cause or symptom fails, one that
    could not run is skipped, one that raised is an error."""
    cases = []
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    by_rule: dict[str, list[Finding]] = {}
    for f in analysis.findings:
        by_rule.setdefault(f.rule, []).append(f)
    for o in analysis.outcomes:
        case = ET.Element("testcase", {"classname": "ddp-autopsy", "name": f"{o.rule} {o.slug}",
                                       "time": "0"})
        counts["tests"] += 1
        found = by_rule.get(o.rule, [])
        failing = [f for f in found if f.role != "info"]
        if o.status == "errored":
            counts["errors"] += 1
            err = ET.SubElement(case, "error", {"message": "the rule raised an exception"})
            err.text = o.error or ""
        elif o.status == "not_evaluated":
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", {"message": "not evaluated: missing "
                                                       + ", ".join(o.missing)})
        elif failing:
            counts["failures"] += 1
            first = failing[0]
            fail = ET.SubElement(case, "failure", {"message": first.summary,
                                                   "type": first.cause or first.role})
            fail.text = _failure_text(failing)
        elif found:
            ET.SubElement(case, "system-out").text = _failure_text(found)
        cases.append(case)
    suite = ET.Element("testsuite", {"name": "ddp-autopsy", **{k: str(v) for k, v in
                                                                counts.items()},
                                     "time": f"{analysis.job.elapsed_s:.3f}"})
    suite.extend(cases)
    root = ET.Element("testsuites", {k: str(v) for k, v in counts.items()})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def render_github(analysis: Analysis) -> str:
    """GitHub Actions workflow commands, one annotation per finding, at its first evidence
    line (``::error file=...,line=...,title=...::message``)."""
    lines = []
    for f in analysis.findings:
        command = {"critical": "error", "error": "error", "warning": "warning"}.get(
            f.severity, "notice")
        props = []
        ev = next((e for e in f.evidence if e.line is not None), None) or \
            (f.evidence[0] if f.evidence else None)
        if ev is not None:
            props.append(f"file={_escape_prop(ev.path)}")
            if ev.line is not None:
                props.append(f"line={ev.line}")
        props.append(f"title={_escape_prop(f'{f.rule} {f.slug} ({f.role})')}")
        message = f.summary + (f"\nRemedy: {f.remedy}" if f.remedy else "")
        lines.append(f"::{command} {','.join(props)}::{_escape_data(message)}")
    return "\n".join(lines)
