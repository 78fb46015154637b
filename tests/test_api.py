"""The Python API (docs/api.md), each time from a fresh interpreter: ``import ddp_autopsy`` is
light, ``ddp_autopsy.analyze`` gives what ``ddp-autopsy analyze`` gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddp_autopsy.cli import main
from ddp_autopsy.rules.engine import get_rule

CASE = Path(__file__).parent / "rules" / "cases" / "RDZV005"


def _py(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_is_light_and_lists_the_api() -> None:
    res = _py("""
import json, sys, ddp_autopsy
light = not any(m == "polars" or m.startswith(("ddp_autopsy.analyzer", "ddp_autopsy.rules"))
                for m in sys.modules)
names = dir(ddp_autopsy)
fn = ddp_autopsy.analyze
print(json.dumps({"light": light, "names": names, "version": ddp_autopsy.__version__,
                  "doc": fn.__doc__, "polars_after": "polars" in sys.modules}))
""")
    assert res["light"]
    assert {"analyze", "collect", "Analysis", "__version__"} <= set(res["names"])
    assert res["version"]
    assert "ddp-autopsy analyze" in res["doc"]


def test_unknown_attribute_is_an_attribute_error() -> None:
    res = _py("""
import json, ddp_autopsy
try:
    ddp_autopsy.analyse
except AttributeError as err:
    print(json.dumps({"err": str(err)}))
""")
    assert "analyse" in res["err"]


def test_analyze_matches_the_cli(tmp_path: Path) -> None:
    res = _py("""
import json, sys, ddp_autopsy, polars as pl
a = ddp_autopsy.analyze(sys.argv[1])
html = a.to_html(sys.argv[2])
ranks = a.ranks
print(json.dumps({
    "type": type(a).__name__, "cause": a.verdict.cause, "culprits": a.verdict.ranks,
    "rules": [f.rule for f in a.findings], "json": json.loads(a.to_json()),
    "is_frame": isinstance(ranks, pl.DataFrame), "columns": ranks.columns,
    "flagged": ranks.filter(pl.col("culprit"))["rank"].to_list(),
    "html_has_summary": a.verdict.summary.split(":")[0] in html,
    "repr_html": a._repr_html_(), "repr": repr(a), "text": a.to_text(),
    "sarif_version": a.to_sarif()["version"],
}))
""", str(CASE), str(tmp_path / "pm.html"))
    cli = CliRunner().invoke(main, ["analyze", str(CASE), "--format", "json"])
    assert cli.exit_code == 0
    want = json.loads(cli.output)
    assert res["type"] == "Analysis"
    assert res["cause"] == get_rule("RDZV005").cause == want["verdict"]["cause"]
    assert res["culprits"] == want["verdict"]["ranks"]
    assert res["rules"] == [f["rule"] for f in want["findings"]]
    assert res["json"]["findings"] == want["findings"]
    assert res["json"]["ranks"] == want["ranks"]
    assert res["is_frame"] and {"rank", "state", "frame", "culprit"} <= set(res["columns"])
    assert res["flagged"] == want["verdict"]["ranks"]
    assert res["html_has_summary"]
    assert (tmp_path / "pm.html").read_text().startswith("<!doctype html>")
    assert "VERDICT" in res["repr_html"] and "<table" in res["repr_html"]
    assert "RDZV005" in res["repr"] and "VERDICT" in res["text"]
    assert res["sarif_version"] == "2.1.0"


def test_analyze_redact_masks_secrets(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    secret = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
    log.write_text(
        f"[rank0]: HF_TOKEN={secret} starting\n"
        f"[rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (token {secret})\n")
    res = _py("""
import json, sys, ddp_autopsy
plain = ddp_autopsy.analyze([sys.argv[1]]).to_json()
a = ddp_autopsy.analyze([sys.argv[1]], redact=True)
masked = a.to_json() + a.to_text() + a._repr_html_() + str(a.ranks["last_line"].to_list())
print(json.dumps({"plain": plain, "masked": masked}))
""", str(log))
    assert secret in res["plain"]
    assert secret not in res["masked"]


def test_analyze_errors_are_exceptions_not_exits(tmp_path: Path) -> None:
    res = _py("""
import json, sys, ddp_autopsy
out = {}
try:
    ddp_autopsy.analyze(sys.argv[1])
except ddp_autopsy.AnalysisError as err:
    out["missing"] = [str(err), len(err.notes)]
try:
    ddp_autopsy.analyze([])
except TypeError as err:
    out["empty"] = str(err)
print(json.dumps(out))
""", str(tmp_path / "nope.log"))
    assert "nothing readable" in res["missing"][0] and "nope.log" in res["missing"][0]
    assert res["missing"][1] >= 1
    assert "at least one path" in res["empty"]


@pytest.mark.parametrize("how", ["pid", "job"])
def test_collect_refuses_what_is_not_a_job(how: str, tmp_path: Path) -> None:
    """``collect`` of a process that is not a distributed job raises CollectError (the CLI's
    exit 2), and leaves no bundle."""
    res = _py("""
import json, os, sys, ddp_autopsy
from ddp_autopsy.collectors.jobs import CollectError
kw = {"pid": os.getpid()} if sys.argv[1] == "pid" else {"job": "no-such-job-key"}
try:
    ddp_autopsy.collect(out=sys.argv[2], deadline=10, **kw)
    print(json.dumps({"raised": None}))
except CollectError as err:
    print(json.dumps({"raised": str(err)}))
""", how, str(tmp_path / "bundle"))
    assert res["raised"]
    assert not (tmp_path / "bundle").exists()
