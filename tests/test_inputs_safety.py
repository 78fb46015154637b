"""Hostile inputs (issue #19, findings 5-8): terminal escapes in log lines and file names,
non-UTF-8 file names, special files, huge and deep trees, symlinks out of the input, output
paths that cannot be written. Each runs the real CLI or reads real files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_autopsy.analyzer import sources
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.reports.termsafe import termsafe
from ddp_autopsy.rules.engine import run

CRASH = (b'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
         b"RuntimeError: {msg}\n")
#: What a hostile log line may hold: clear screen, alternate screen, OSC 0 window title, OSC 8
#: hyperlink, OSC 52 clipboard write, an 8-bit CSI (C1, as UTF-8), a carriage return, a bell.
ESCAPES = (b"\x1b[2J\x1b[?1049h\x1b]0;pwned\x07\x1b]8;;https://evil.example/\x1b\\link"
           b"\x1b]8;;\x1b\\\x1b]52;c;cm0gLXJmIH4=\x07\xc2\x9b2Jhidden\rover")
FORBIDDEN = (b"\x1b[2J", b"\x1b[?1049h", b"\x1b]", b"\x07", b"\xc2\x9b", b"\r")


def cli(*args: str | bytes, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess; a hang fails the test instead of blocking it."""
    return subprocess.run([sys.executable, "-m", "ddp_autopsy", *args], capture_output=True,
                          timeout=timeout, **kw)  # type: ignore[call-overload]


def assert_inert(out: bytes) -> None:
    for seq in FORBIDDEN:
        assert seq not in out, (seq, out[:2000])


def crash_log(path: Path | bytes, msg: bytes = b"boom") -> None:
    with open(path, "wb") as fh:
        fh.write(CRASH.replace(b"{msg}", msg))


# --- 5. terminal escapes ------------------------------------------------------------------------

def test_termsafe_escapes_controls_keeps_tabs_and_text() -> None:
    assert termsafe("a\tb é 日本") == "a\tb é 日本"
    assert termsafe("\x1b]52;c;x\x07\x9b\x7f\r\n\x00") == "\\x1b]52;c;x\\x07\\x9b\\x7f\\r\\n\\x00"
    assert termsafe("caf\udce9") == "caf\\xe9"


@pytest.mark.parametrize("color", [[], ["--color"]], ids=["piped", "forced-terminal"])
def test_analyze_prints_no_escape_from_a_log_line(tmp_path: Path, color: list[str]) -> None:
    crash_log(tmp_path / "rank0.log", b"boom [bold]x[/bold] [link=y]z[/link] " + ESCAPES)
    res = cli("analyze", *color, str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert_inert(res.stdout)
    # The reader may drop the escape sequences; what is left is shown escaped (the C1 CSI).
    assert b"hidden" in res.stdout and b"\\x9b2J" in res.stdout
    assert b"[bold]x[/bold] [link=y]z[/link]" in res.stdout  # rich markup printed literally


def test_file_name_with_escapes_is_shown_escaped(tmp_path: Path) -> None:
    crash_log(tmp_path / "rank0\x1b]0;title\x07.log")
    (tmp_path / "notes\x1b[2J.bin").write_bytes(b"\x00" * 100)  # a note names it
    for args in (["analyze", str(tmp_path)], ["grep", "boom", str(tmp_path)]):
        res = cli(*args)
        assert res.returncode == 0, res.stderr
        assert_inert(res.stdout + res.stderr)
        assert b"rank0\\x1b]0;title\\x07.log" in res.stdout


def test_grep_prints_no_escape(tmp_path: Path) -> None:
    crash_log(tmp_path / "rank0.log", b"boom " + ESCAPES)
    res = cli("grep", "boom", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert_inert(res.stdout)
    assert b"\\x1b[2J" in res.stdout
    hits = json.loads(cli("grep", "boom", str(tmp_path), "--format", "json").stdout)["hits"]
    assert "\x1b[2J" in hits[0]["text"]  # JSON keeps the line as it is (escaped by JSON)


def test_stack_tree_prints_no_escape(tmp_path: Path) -> None:
    dump = ('Process 7: python train.py\nPython v3.11.7 (/usr/bin/python3)\n\n'
            'Thread 7 (idle): "Main\x1b]0;t\x07Thread"\n'
            '    evil\x1b[2J\x9b2J (tr\x1b]8;;x\x1b\\ain.py:3)\n    <module> (train.py:8)\n')
    (tmp_path / "stack-rank0.txt").write_text(dump)
    res = cli("analyze", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert b"Where the ranks are" in res.stdout
    assert_inert(res.stdout)
    assert b"evil\\x1b[2J\\x9b2J" in res.stdout


# --- 6. non-UTF-8 file names --------------------------------------------------------------------

def test_latin1_file_names_through_analyze_report_inspect(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path)
    logs = os.path.join(root, b"caf\xe9")
    os.mkdir(logs)
    crash_log(os.path.join(logs, b"rank0-caf\xe9.log"))
    single = os.path.join(root, b"na\xefve.log")
    crash_log(single)

    for target in (logs, single):
        res = cli(b"analyze", target)
        assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
        assert b"VERDICT" in res.stdout and b"\\xe" in res.stdout
        data = json.loads(cli(b"analyze", target, b"--format", b"json").stdout)
        assert "\\xe" in json.dumps(data["inputs"][0]["path"])

    html = os.path.join(root, b"rapport-\xe9t\xe9.html")
    res = cli(b"report", logs, b"-o", html)
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert b"\\xe9t\\xe9.html" in res.stdout
    assert b"rank0-caf\\xe9.log" in Path(os.fsdecode(html)).read_bytes()

    res = cli(b"analyze", logs, b"--html", html)
    assert res.returncode == 0 and b"HTML report: " in res.stdout, res.stderr
    assert b"\\xe9t\\xe9.html" in res.stdout

    out = os.path.join(root, b"fra\xeemes")
    res = cli(b"inspect", logs, b"--out", out)
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert b"fra\\xeemes/events.parquet" in res.stdout
    assert os.path.exists(os.path.join(out, b"events.parquet"))

    res = cli(b"grep", b"boom", logs)
    assert res.returncode == 0 and b"rank0-caf\\xe9.log:3" in res.stdout, res.stderr


# --- 7. special files ---------------------------------------------------------------------------

def test_fifo_and_dev_zero_given_directly_are_skipped_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "nccl_trace_rank_0.pipe"  # what a glob over a Flight Recorder dir matches
    os.mkfifo(fifo)
    crash_log(tmp_path / "rank1.log")
    html = tmp_path / "r.html"
    for cmd in (["analyze"], ["grep", "boom"], ["report", "-o", str(html)]):
        res = cli(*cmd, str(fifo), "/dev/zero", str(tmp_path / "rank1.log"), timeout=60)
        assert res.returncode == 0, res.stderr
        shown = res.stderr + res.stdout + (html.read_bytes() if html.exists() else b"")
        assert b"a FIFO (named pipe), skipped (never opened)" in shown  # the HTML: a note
        assert b"nccl_trace_rank_0.pipe" in shown
    res = cli("analyze", "/dev/zero", str(fifo), timeout=60)
    assert res.returncode == 3
    assert b"/dev/zero: a character device, skipped (never opened)" in res.stderr


def test_special_files_in_a_directory_are_noted(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fr.pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "agent.sock"))
    try:
        os.symlink("/dev/zero", tmp_path / "zero.log")  # a link to a device: never opened
        crash_log(tmp_path / "rank1.log")
        res = cli("analyze", str(tmp_path), timeout=60)
    finally:
        sock.close()
    assert res.returncode == 0, res.stderr
    assert b"fr.pipe: a FIFO (named pipe), skipped" in res.stdout
    assert b"agent.sock: a socket, skipped" in res.stdout
    assert b"boom" in res.stdout


def test_open_regular_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "swapped.log"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO"):
        sources.open_regular(fifo)


# --- 8. many files, deep trees, symlinks, output paths ------------------------------------------

def test_many_files_keep_the_failing_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More files than the cap: the one with the failure is read even though it is last in
    read order and the oldest (the cap is lowered: the policy, not the count, is under test)."""
    monkeypatch.setattr(sources, "MAX_FILES", 40)
    for i in range(40):
        (tmp_path / f"worker{i:03d}.log").write_text(f"step {i} loss 0.25\n")
    crash_log(tmp_path / "zz-rank7.log", b"the failure")
    os.utime(tmp_path / "zz-rank7.log", (1_000_000_000, 1_000_000_000))
    job = load([tmp_path])
    assert "the failure" in " ".join(job.events["text"].to_list())
    assert any("41 files" in n.message and "1 skipped" in n.message for n in job.notes)
    assert run(job).verdict is not None


def test_thousand_levels_deep(tmp_path: Path) -> None:
    path = str(tmp_path / "deep")
    os.mkdir(path)
    for _ in range(1000):  # os.makedirs recurses: build it one level at a time
        path = os.path.join(path, "d")
        os.mkdir(path)
    crash_log(Path(path) / "rank3.log", b"deep down")
    try:
        res = cli("analyze", str(tmp_path / "deep"), "--format", "json")
        assert res.returncode == 0 and b"RecursionError" not in res.stderr, res.stderr[-2000:]
        assert "deep down" in json.loads(res.stdout)["verdict"]["summary"]
    finally:  # pytest's own clean-up of old temp dirs recurses and would fail on this tree
        os.unlink(Path(path) / "rank3.log")
        while path != str(tmp_path):
            os.rmdir(path)
            path = os.path.dirname(path)


def test_symlink_out_of_the_input_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "shadow").write_text("RuntimeError: root:$6$SECRETHASH:19000\n")
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    crash_log(logs / "sub" / "rank0.log")
    (logs / "shadow.log").symlink_to(outside / "shadow")
    (logs / "up.log").symlink_to("../etc/shadow")
    (logs / "etc").symlink_to(outside)  # a directory outside
    (logs / "inside.log").symlink_to("sub/rank0.log")  # inside: followed
    for args in (["analyze", str(logs)], ["grep", "RuntimeError", str(logs)]):
        res = cli(*args)
        assert res.returncode == 0, res.stderr
        assert b"SECRETHASH" not in res.stdout + res.stderr
        text = res.stdout + res.stderr
        assert b"shadow.log: symlink to outside the input directory, not followed" in text
        assert b"up.log: symlink to outside the input directory" in text
    grep = cli("grep", "boom", str(logs)).stdout
    assert b"inside.log:3" in grep and b"rank0.log:3" in grep
    # A link named on the command line is the user's choice: followed.
    direct = cli("grep", "SECRETHASH", str(logs / "shadow.log"))
    assert direct.returncode == 0 and b"SECRETHASH" in direct.stdout


def test_unwritable_output_is_refused_before_the_analysis(tmp_path: Path) -> None:
    # The input does not exist: had the analysis run first, it would exit 3, not 2.
    missing = str(tmp_path / "no-such-input")
    for args in (["report", missing, "-o", str(tmp_path / "nodir" / "r.html")],
                 ["analyze", missing, "--html", str(tmp_path / "nodir" / "r.html")]):
        res = cli(*args)
        assert res.returncode == 2, res
        assert b"Traceback" not in res.stderr
        assert b"cannot write" in res.stderr and b"nodir" in res.stderr
    (tmp_path / "file").write_text("")
    res = cli("inspect", missing, "--out", str(tmp_path / "file" / "frames"))
    assert res.returncode == 2 and b"Traceback" not in res.stderr, res.stderr


def test_lines_of_a_kind_past_its_quota_are_counted_not_classified(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 GB of watchdog lines ran at 12 MB/s: every line was classified, then dropped. Past a
    kind's quota its lines are counted only; a crash among them is still read."""
    from ddp_autopsy.analyzer import events

    monkeypatch.setattr(events, "MAX_EVENTS_PER_KIND", 50)
    wd = ("[rank{r}]:[E1123 21:00:00.000000 100 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog "
          "caught collective operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, "
          "NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600081 milliseconds before timing "
          "out.\n")
    lines = [wd.format(r=i % 4, s=i) for i in range(3000)]
    lines[2500:2500] = ["[rank2]: Traceback (most recent call last):\n",
                        '[rank2]:   File "train.py", line 9, in <module>\n',
                        "[rank2]: RuntimeError: the real failure\n"]
    (tmp_path / "job.log").write_text("".join(lines))
    calls = 0
    classify = events._classify

    def counting(*args: object, **kw: object) -> None:
        nonlocal calls
        calls += 1
        classify(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(events, "_classify", counting)
    job = load([tmp_path])
    kinds = job.events["kind"].to_list()
    assert kinds.count("watchdog_timeout") == 50
    assert "the real failure" in " ".join(job.events.filter(
        job.events["kind"] == "exception")["text"].to_list())
    assert any("2950 more 'watchdog_timeout' lines" in n.message for n in job.notes), job.notes
    assert calls < 3000 // 2  # not every line was classified
