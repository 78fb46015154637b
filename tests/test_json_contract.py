"""The JSON output is a public contract: validate real output against the published schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from scenarios.runner import SCENARIOS
from test_scenario_verdicts import user_inputs

from ddp_autopsy.cli import main

SCHEMA = json.loads(
    (Path(__file__).parents[1] / "ddp_autopsy" / "schemas" / "analysis.schema.json").read_text()
)
NEAR_MISS = Path(__file__).parent / "rules" / "near_miss"
CASES = sorted(p for p in NEAR_MISS.iterdir() if p.is_dir())


def _analyze_json(*paths: Path) -> dict:
    result = CliRunner().invoke(main, ["analyze", *map(str, paths), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_output_validates(case: Path) -> None:
    jsonschema.validate(_analyze_json(case), SCHEMA)


@pytest.mark.scenario
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_output_validates(name: str, scenario_run) -> None:
    """Real jobs' output (the session's cached scenario runs) through the real CLI."""
    sr = scenario_run(name)
    assert sr.error is None, f"{name}: the scenario itself went wrong: {sr.error}"
    out = _analyze_json(*user_inputs(sr))
    jsonschema.validate(out, SCHEMA)
    # What the schema cannot say: root causes first, the verdict is the first of them.
    roles = [f["role"] for f in out["findings"]]
    assert roles == sorted(roles, key=lambda r: r != "root_cause"), roles
    first = out["findings"][0] if roles and roles[0] == "root_cause" else None
    assert out["verdict"] == first
    assert (first or {}).get("cause") == sr.expect["cause"]
    assert out["inputs"], f"{name}: no inputs listed"


def test_verdict_is_the_first_root_cause(tmp_path: Path) -> None:
    (tmp_path / "x.log").write_text(
        "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1a000\n"
        "[rank1]: RuntimeError: Connection closed by peer [10.0.0.1]:1234\n")
    out = _analyze_json(tmp_path)
    jsonschema.validate(out, SCHEMA)
    assert out["verdict"] == out["findings"][0]
    assert out["verdict"]["cause"] == "duplicate_gpu" and out["verdict"]["ranks"] == [0, 1]
    ev = out["verdict"]["evidence"][0]
    assert ev["path"].endswith("x.log") and ev["line"] == 1


def test_schema_rejects_a_wrong_cause() -> None:
    bad = {"schema": "ddp-autopsy/analysis/1", "tool": {"name": "ddp-autopsy", "version": "0"},
           "verdict": None, "findings": [], "inputs": [], "notes": [],
           "ranks": {"world_size": None, "known": []}, "rules": []}
    jsonschema.validate(bad, SCHEMA)
    bad["findings"] = [{"id": "F1", "rule": "X001", "slug": "x", "cause": "gremlins"}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
