"""The CLI's rough edges of issue #17, each through the real command: colour on a real
terminal (a pty), piped stack trees, grep's ranks and exit codes, demo run twice, help texts,
"did you mean", the port-in-use remedy, and the JSON schemas of grep, rules and collect."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.cli import main

SCHEMAS = Path(__file__).parents[1] / "ddp_autopsy" / "schemas"
CASE = Path(__file__).parent / "rules" / "cases" / "RDZV005"
CLI = [sys.executable, "-c", "import sys; from ddp_autopsy.cli import main; "
                            "main(sys.argv[1:], prog_name='ddp-autopsy')"]
#: An SGR sequence that sets a colour (NO_COLOR forbids colour; bold and dim stay).
COLOUR = re.compile(rb"\x1b\[(?:[0-9]+;)*(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])(?:;[0-9]+)*m")


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def _on_a_terminal(args: list[str], env: dict[str, str]) -> bytes:
    """Run the CLI with stdout on a real pseudo-terminal; return what it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CLI, *args], stdout=follower, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(leader)
        proc.wait(timeout=30)
    assert proc.returncode == 0, out[-2000:]
    return out


@pytest.mark.parametrize("no_color,flag,coloured", [
    (None, None, True),          # a terminal: colour
    ("1", None, False),          # NO_COLOR wins on a terminal
    ("1", "--color", True),      # unless --color says otherwise
    (None, "--no-color", False),
])
def test_no_color_on_a_terminal(no_color: str | None, flag: str | None, coloured: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm-256color"
    if no_color is not None:
        env["NO_COLOR"] = no_color
    out = _on_a_terminal(["analyze", str(CASE), *([flag] if flag else [])], env)
    assert b"VERDICT" in out
    assert bool(COLOUR.search(out)) is coloured, out[:400]


def test_color_option_on_every_colour_command() -> None:
    for command in ("analyze", "demo", "watch", "run"):
        res = CliRunner().invoke(main, [command, "--help"])
        assert "--color / --no-color" in res.output, command


@pytest.mark.parametrize("command,option,words", [
    ("demo", "--html", "HTML post-mortem"),
    ("report", "--output", "HTML file"),
    ("rules", "--format", "json"),
    ("rule", "--format", "JSON"),
    ("grep", "--local-rank", "local rank"),
])
def test_help_texts(command: str, option: str, words: str) -> None:
    res = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    line = next(ln for ln in res.output.splitlines() if option in ln)
    assert words in line, line


def test_piped_stack_tree_keeps_each_frame_on_one_line(tmp_path: Path) -> None:
    """Piped, the terminal report's tree is laid out without a width: a long frame is one
    line (the rich default of 80 columns broke it mid-path)."""
    long = "/".join(["very_long_directory_name"] * 6) + "/module_with_a_long_name.py"
    dump = "".join(
        f"Process {800 + r}: python -u train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        f"Thread {800 + r} (idle): \"MainThread\"\n"
        + ("    evaluate_on_the_validation_set (" if r == 2 else "    all_reduce (")
        + f"{long}:{40 + r})\n    main (train.py:9)\n\n"
        for r in range(3))
    (tmp_path / "pyspy.txt").write_text(dump)
    out = subprocess.run([*CLI, "analyze", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    frames = [ln for ln in out.stdout.splitlines() if "module_with_a_long_name" in ln]
    assert frames, out.stdout
    for ln in frames:
        assert f"{long}:4" in ln, ln  # the whole path and its line number on one line
    assert not any(ln.strip().startswith("_name.py") for ln in out.stdout.splitlines())


# --- grep -------------------------------------------------------------------------------

def _bundle(root: Path) -> Path:
    """A collect bundle of node 1 of a 2-node torchrun job (ranks 4-7): the manifest knows
    each worker's rank; the logs are the agent's console ([defaultN]: prefixes) and the
    torchrun --log-dir files of the workers."""
    bundle = root / "node1"
    procs = [{"pid": 900, "role": "agent", "rank": None, "local_rank": None}] + [
        {"pid": 901 + lr, "role": "worker", "rank": 4 + lr, "local_rank": lr}
        for lr in range(4)]
    logs = [{"path": layout.log_copy("/job/console.log"), "pid": 900}]
    for lr in range(4):
        logs.append({"path": layout.log_copy(f"/job/tr/attempt_0/{lr}/stdout.log"),
                     "pid": 901 + lr})
    for entry in logs:
        f = bundle / entry["path"]
        f.parent.mkdir(parents=True, exist_ok=True)
        if entry["pid"] == 900:
            f.write_text("".join(f"[default{lr}]:step 7 loss {'nan' if lr == 2 else 0.5}\n"
                                 for lr in range(4)))
        else:
            f.write_text(f"step 7 loss {'nan' if entry['pid'] == 903 else 0.5}\n")
    manifest = {"schema": layout.SCHEMA, "host": "node1", "complete": True,
                "processes": procs, "logs": logs}
    (bundle / layout.MANIFEST).write_text(json.dumps(manifest))
    return bundle


def _grep(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(main, ["grep", *args, "--format", "json"])
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, _schema("grep"))
    return res.exit_code, doc


def test_grep_rank_srun_label_default_prefix_and_log_dir(tmp_path: Path) -> None:
    (tmp_path / "slurm-42.out").write_text("12: [rank12]: loss nan at step 5\n"
                                           "3: [rank3]: loss 0.5 at step 5\n")
    (tmp_path / "console.log").write_text("[default2]:[rank2]: starting\n"
                                          "[default2]:loss nan at step 5\n"
                                          "[default1]:loss 0.4 at step 5\n")
    d = tmp_path / "tr" / "run_1" / "attempt_0" / "6"
    d.mkdir(parents=True)
    (d / "stdout.log").write_text("[rank6]: starting\nloss nan at step 5\n")
    code, doc = _grep("loss nan", str(tmp_path), "--rank", "12")
    assert code == 0 and [h["rank"] for h in doc["hits"]] == [12]
    code, doc = _grep("loss nan", str(tmp_path), "--rank", "2")
    assert code == 0 and [(Path(h["path"]).name, h["line"]) for h in doc["hits"]] == [
        ("console.log", 2)]
    code, doc = _grep("loss nan", str(tmp_path), "--rank", "6")
    assert code == 0 and [(Path(h["path"]).name, h["line"], h["local_rank"])
                          for h in doc["hits"]] == [("stdout.log", 2, 6)]
    code, doc = _grep("loss", str(tmp_path), "--rank", "1")
    assert code == 1 and doc["hits"] == []  # [default1] names no global rank anywhere
    assert any("--local-rank 1" in n["message"] for n in doc["notes"])
    code, doc = _grep("loss", str(tmp_path), "--local-rank", "1")
    assert code == 0 and [h["text"] for h in doc["hits"]] == ["[default1]:loss 0.4 at step 5"]


def test_grep_rank_inside_a_bundle(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    code, doc = _grep("loss nan", str(bundle), "--rank", "6")
    got = sorted((Path(h["path"]).name, h["rank"], h["local_rank"]) for h in doc["hits"])
    assert code == 0 and got == [("console.log", 6, 2), ("stdout.log", 6, 2)], doc
    code, doc = _grep("loss nan", str(bundle), "--rank", "2")
    assert code == 1 and doc["hits"] == []  # local rank 2 is global rank 6 on this node
    # The README's SLURM example: one bundle per node, searched together.
    text = CliRunner().invoke(main, ["grep", "loss 0.5", str(tmp_path), "--rank", "7"]).output
    assert text.count("[rank 7]") == 2, text


def test_grep_missing_path_exits_3_and_bad_regex_says_why(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["grep", "x", str(tmp_path / "nope.log")])
    assert res.exit_code == 3
    assert "does not exist" in res.output
    (tmp_path / "a.log").write_text("nothing here\n")
    res = CliRunner().invoke(main, ["grep", "zzz", str(tmp_path / "nope.log"),
                                    str(tmp_path / "a.log")])
    assert res.exit_code == 1  # one path read, nothing matched: grep's 1
    res = CliRunner().invoke(main, ["grep", "loss (nan", str(tmp_path)])
    assert res.exit_code == 2
    assert "unclosed group" in res.output and "Traceback" not in res.output
    assert "col(" not in res.output  # polars' own context is not shown


# --- demo, rule, port in use -----------------------------------------------------------------

def test_demo_twice_in_one_folder_is_a_clear_message(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "demo"
    (out / "bundle").mkdir(parents=True)
    (out / "bundle" / layout.MANIFEST).write_text("{}")
    res = subprocess.run([*CLI, "demo", "--out", str(out), "--html", str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "already holds a demo run" in res.stderr and "--out" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not (out / "console.log").exists()  # refused before any job started


def test_exit_codes_are_documented() -> None:
    """Every command that exits with its own codes has them in the table (demo's 1 was
    missing; collect's 2 and 130 too)."""
    doc = (Path(__file__).parents[1] / "docs" / "json.md").read_text()
    table = doc[doc.index("## Exit codes"):]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ")]
    for command, codes in {"demo": ("1",), "collect": ("1", "2", "130"), "grep": ("1",),
                           "patterns": ("2",)}.items():
        for code in codes:
            assert any(ln.startswith(f"| {code} |") and f"`{command}`" in ln for ln in rows), \
                (command, code)


@pytest.mark.parametrize("typo,want", [("RDZV01", "RDZV001"), ("rdzv1", "RDZV001"),
                                       ("port-in-us", "port-in-use")])
def test_rule_did_you_mean(typo: str, want: str) -> None:
    res = CliRunner().invoke(main, ["rule", typo])
    assert res.exit_code == 2
    assert f"did you mean {want}" in res.output


PORT_LINES = (
    "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29517 "
    "(errno: 98 - Address already in use).\n"
    "RuntimeError: The server socket has failed to listen on any local network address. The "
    "server socket has failed to bind to [::]:29517 (errno: 98 - Address already in use).\n")


def test_port_in_use_remedy_names_the_port_and_no_rank_when_no_worker_started(
        tmp_path: Path) -> None:
    (tmp_path / "agent.log").write_text(PORT_LINES)
    res = CliRunner().invoke(main, ["analyze", str(tmp_path), "--format", "json"])
    verdict = json.loads(res.output)["verdict"]
    assert verdict["rule"] == "RDZV001"
    assert "sport = :29517" in verdict["remedy"] and "PORT" not in verdict["remedy"]
    assert verdict["ranks"] == []
    assert "rank 0" not in CliRunner().invoke(main, ["analyze", str(tmp_path)]).output
    # Workers did start (their lines name ranks): the store host is rank 0's process.
    (tmp_path / "agent.log").write_text("[rank1]: waiting for the store\n" + PORT_LINES)
    res = CliRunner().invoke(main, ["analyze", str(tmp_path), "--format", "json"])
    assert json.loads(res.output)["verdict"]["ranks"] == [0]


# --- JSON schemas ----------------------------------------------------------------------------

def test_rules_and_rule_json_validate() -> None:
    schema = _schema("rules")
    listing = json.loads(CliRunner().invoke(main, ["rules", "--format", "json"]).output)
    jsonschema.validate(listing, schema)
    assert len(listing) >= 10
    one = json.loads(CliRunner().invoke(main, ["rule", "RDZV001", "--format", "json"]).output)
    jsonschema.validate(one, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{**one, "role": "culprit"}], schema)


def test_schemas_are_valid_draft_2020_12() -> None:
    for name in ("analysis", "grep", "rules", "collect", "patterns", "compare"):
        jsonschema.Draft202012Validator.check_schema(_schema(name))


@pytest.mark.scenario
def test_collect_json_validates(tmp_path: Path) -> None:
    """A real hung mp.spawn job, collected with --format json."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent))
    import collect_helpers as h

    job = h.start_spawn(tmp_path / "spawn")
    try:
        job.wait_ready(2, 120)
        res = subprocess.run([*CLI, "collect", "--pid", str(job.pid), "--out",
                              str(tmp_path / "bundle"), "--format", "json", "--deadline", "60"],
                             capture_output=True, text=True, timeout=180)
    finally:
        job.stop()
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, _schema("collect"))
    assert doc["processes"] >= 2 and Path(doc["bundle"]).is_dir()


def test_shell_completion_of_rule_codes() -> None:
    """What bash gets back for ``ddp-autopsy rule RDZV00<Tab>`` (click's completion protocol,
    through the installed entry point's code path)."""
    env = {**os.environ, "_DDP_AUTOPSY_COMPLETE": "bash_complete",
           "COMP_WORDS": "ddp-autopsy rule RDZV00", "COMP_CWORD": "2"}
    out = subprocess.run(CLI, capture_output=True, text=True, timeout=60, env=env)
    got = [ln.split(",", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("plain,")]
    assert "RDZV001" in got and all(c.startswith("RDZV00") for c in got), out.stdout
    env["COMP_WORDS"] = "ddp-autopsy rule port-in"
    out = subprocess.run(CLI, capture_output=True, text=True, timeout=60, env=env)
    assert "plain,port-in-use" in out.stdout.splitlines()
    source = subprocess.run(CLI, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "_DDP_AUTOPSY_COMPLETE": "bash_source"})
    assert "complete " in source.stdout and "ddp-autopsy" in source.stdout


# --- progress, inputs[].bytes -----------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_percentage_and_time_left_for_files_of_known_size(
        tmp_path: Path, monkeypatch) -> None:
    """The issue's "613/? MB": a plain file's size is known, so the bar has a total, a
    percentage and the time left; an archive (read decompressed) or a bundle (summaries) has
    none, and the bar says only what it read."""
    from ddp_autopsy.analyzer import progress
    from ddp_autopsy.analyzer.job import load

    monkeypatch.setattr(progress, "DELAY", 0.0)
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text("step 1 loss 0.5\n" * 100_000)
    assert progress.input_bytes([log.parent]) == log.stat().st_size
    out = _Terminal()
    with progress.reading(True, out, paths=[log.parent]):
        load([log.parent])
    shown = out.getvalue()
    assert "%" in shown and "1.6/1.6 MB" in shown, shown[-400:]
    assert re.search(r"\d:\d\d:\d\d", shown)  # the time-left column
    packed = tmp_path / "logs.tar.gz"
    packed.write_bytes(b"")
    assert progress.input_bytes([log.parent, packed]) is None
    assert progress.input_bytes([_bundle(tmp_path / "b")]) is None
    out = _Terminal()
    with progress.reading(True, out, paths=[packed]):
        load([log.parent])
    assert "%" not in out.getvalue() and "/1.6 MB" not in out.getvalue()


def test_inputs_bytes_of_bundle_logs(tmp_path: Path) -> None:
    """``inputs[].bytes`` of a bundle's logs is their size, whether they were read raw or
    taken from collect's pre-parsed summaries."""
    from ddp_autopsy.collectors import summaries

    bundle = _bundle(tmp_path)
    sizes = {p.name: p.stat().st_size for p in (bundle / "logs").rglob("*.log")}

    def logged() -> tuple[list[tuple[str, int]], list[str]]:
        res = CliRunner().invoke(main, ["analyze", str(bundle), "--format", "json"])
        doc = json.loads(res.stdout)
        jsonschema.validate(doc, _schema("analysis"))
        return ([(Path(i["path"]).name, i["bytes"]) for i in doc["inputs"] if i["kind"] == "log"],
                [n["message"] for n in doc["notes"]])

    raw, _ = logged()
    assert len(raw) == 5 and all(n == sizes[name] and n > 0 for name, n in raw), raw
    manifest = json.loads((bundle / layout.MANIFEST).read_text())
    manifest["summaries"] = summaries.write(bundle)
    (bundle / layout.MANIFEST).write_text(json.dumps(manifest))
    summarized, notes = logged()
    assert not [n for n in notes if "summar" in n], notes  # the summary was used, not re-read
    assert sorted(summarized) == sorted(raw)
