"""CLI behaviour and exit codes (docs/json.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddp_autopsy.cli import main


def test_usage_error_exits_2() -> None:
    assert CliRunner().invoke(main, ["analyze"]).exit_code == 2


def test_nothing_readable_exits_3(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "missing")])
    assert result.exit_code == 3
    assert "does not exist" in result.output


def test_text_verdict_first_with_evidence(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("noise\nRuntimeError: Address already in use\n")
    result = CliRunner().invoke(main, ["analyze", str(log), "--no-color"])
    assert result.exit_code == 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[1].startswith("VERDICT") and "address already in use" in lines[1]
    assert f"{log}:2" in result.output


def _sections(output: str) -> dict[str, list[str]]:
    """The text report's lines by section: "head" (up to "Other findings"), then one list
    per section title (an unindented line)."""
    sections: dict[str, list[str]] = {"head": []}
    current = "head"
    for line in output.splitlines():
        if line in ("Other findings", "Not examined"):
            current = line
            sections[current] = []
        else:
            sections[current].append(line)
    return sections


@pytest.mark.scenario("rank_crash_exception")
def test_text_marks_symptoms_and_lists_what_was_not_examined(tmp_path: Path,
                                                             scenario_run) -> None:
    console = scenario_run("rank_crash_exception").console  # a real torchrun crash log
    core = tmp_path / "core.4242"  # a core dump that matched a log glob
    core.write_bytes(bytes(range(256)) * 64)
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"PK\x03\x04" + bytes(512))
    args = ["analyze", str(console), str(core), str(ckpt)]
    result = CliRunner().invoke(main, [*args, "--no-color"])
    assert result.exit_code == 0, result.output
    data = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    verdict = data["verdict"]
    assert verdict["cause"] == "rank_crashed"
    sections = _sections(result.output)
    assert list(sections) == ["head", "Other findings", "Not examined"], list(sections)
    assert any(ln.startswith("VERDICT") for ln in sections["head"])

    # Every symptom is listed as a symptom of the verdict, each with one file:line.
    other = sections["Other findings"]
    symptoms = [f for f in data["findings"] if f["role"] == "symptom"]
    assert {f["rule"] for f in symptoms} >= {"SYM002"}  # ranks 0-1 lost their peer
    for f in symptoms:
        head = f"  {f['id']} [symptom of {verdict['id']}] {f['summary']}"
        i = next((i for i, ln in enumerate(other) if ln.startswith(head)), None)
        assert i is not None, f"{head!r} not in\n" + "\n".join(other)
        ev = f["evidence"][0]
        assert other[i + 1].strip().startswith(f"{ev['path']}:{ev['line']}  ")

    # Inputs that were not read, each with its reason.
    skipped = sections["Not examined"]
    assert f"  {core}: binary file (NUL bytes), not read as a log" in skipped
    assert f"  {ckpt}: not a log (by its file type), skipped" in skipped


def test_log_text_is_not_rich_markup(tmp_path: Path) -> None:
    (tmp_path / "t.log").write_text("RuntimeError: Address already in use [bold red]x[/] [link]\n")
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-color"])
    assert "[bold red]x[/] [link]" in result.output


def test_html_option_writes_an_escaped_report(tmp_path: Path) -> None:
    (tmp_path / "t.log").write_text("RuntimeError: Address already in use <script>alert(1)</script>\n")
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "t.log"), "--html", str(out)])
    assert result.exit_code == 0
    html = out.read_text()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html


def test_rules_and_rule_commands() -> None:
    runner = CliRunner()
    listing = runner.invoke(main, ["rules"]).output
    assert "RDZV001" in listing and "port-in-use" in listing
    one = json.loads(runner.invoke(main, ["rule", "rdzv001", "--format", "json"]).output)
    assert one["code"] == "RDZV001" and one["sections"]["Remedy"]
    assert runner.invoke(main, ["rule", "NOPE999"]).exit_code == 2


def test_inspect_writes_parquet_frames(tmp_path: Path) -> None:
    import polars as pl

    (tmp_path / "rank3.log").write_text("ValueError: bad\n")
    result = CliRunner().invoke(main, ["inspect", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    events = pl.read_parquet(tmp_path / "o" / "events.parquet")
    assert events.filter(pl.col("kind") == "exception")["rank"].to_list() == [3]
    for name in ("stacks", "ranks", "env", "processes"):
        assert (tmp_path / "o" / f"{name}.parquet").exists()
