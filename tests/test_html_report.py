"""The HTML post-mortem (reports/html.py + reports/templates): content, escaping, bounds.

The browser-level checks (console errors, inert XSS probe, screenshots, load time) are in
test_html_browser.py; the helpers that write fixture jobs live here and are shared with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from html import unescape
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from ddp_autopsy.analyzer.job import ENV_SCHEMA, Bundle, load
from ddp_autopsy.cli import main as cli
from ddp_autopsy.reports import html, json_report
from ddp_autopsy.rules.engine import Analysis, run

#: Planted in log lines, stack frames and env values; must stay inert text everywhere.
PROBE = '<script>window.__xss=1</script>"><img src=x onerror="window.__xss=2">'
SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
MB = 1 << 20


def _stack(pid: int, frames: list[str], threads: str = "") -> str:
    body = "".join(f"    {f}\n" for f in frames)
    return (f"Process {pid}: python -u train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            f'Thread {pid} (idle): "MainThread"\n{body}{threads}')


WAITING = ["all_reduce (torch/distributed/distributed_c10d.py:3252)",
           "wrapper (torch/distributed/c10d_logger.py:83)", "main (train.py:48)",
           "<module> (train.py:60)"]


def write_hang(root: Path, world: int = 4, odd: int = 2) -> Path:
    """A hang: rank ``odd`` in evaluate (a frame named with the probe), the others in
    all_reduce and, later, watchdog timeouts in the console log."""
    root.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        frames = [f"{PROBE} (train.py:31)", "evaluate (train.py:30)", "main (train.py:52)",
                  "<module> (train.py:60)"] if r == odd else WAITING
        pin = (f'Thread {9000 + r} (active): "pin_memory"\n'
               "    _worker (torch/utils/data/_utils/pin_memory.py:50)\n"
               "    run (threading.py:975)\n")
        (root / f"stack_rank{r}.txt").write_text(_stack(4240 + r, frames, pin))
    lines = [f"[rank{r}]:[E1122 13:23:{24 + r:02d}.941166255 ProcessGroupNCCL.cpp:616] [Rank {r}]"
             " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
             "OpType=ALLREDUCE, NumelIn=7, NumelOut=7, Timeout(ms)=1800000) ran for 1800066 "
             "milliseconds before timing out." for r in range(world) if r != odd]
    lines.append("W1122 13:23:40.222000 2521679 site-packages/torch/distributed/elastic/"
                 "multiprocessing/api.py:908] Sending process 4240 closing signal SIGTERM")
    (root / "console.log").write_text("\n".join(lines) + "\n")
    return root


def write_crash(root: Path) -> Path:
    """A crash whose exception message holds the probe and a token."""
    root.mkdir(parents=True, exist_ok=True)
    msg = f"bad batch {PROBE} HF_TOKEN={SECRET}"
    (root / "console.log").write_text(
        "[rank0]:[E1122 08:00:10.100000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, "
        "NumelOut=4, Timeout(ms)=60000) ran for 60012 milliseconds before timing out.\n"
        "step 3 ok\n"
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/w/train.py", line 25, in train_step\n'
        f"[rank2]:     raise ValueError({msg!r})\n"
        f"[rank2]: ValueError: {msg}\n"
        "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:45067\n"
        "W1122 08:00:11.000000 77 torch/distributed/elastic/multiprocessing/api.py:908] "
        "Sending process 80 closing signal SIGTERM\n")
    return root


def write_big(root: Path, world: int = 4096, odd: int = 1234, depth: int = 40) -> Path:
    """A 4096-rank hang: a py-spy dump per rank (``depth`` frames) and a console log with every
    other rank's watchdog timeout."""
    stacks = root / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    layers = [f"forward (model/layer{i}.py:{100 + i})" for i in range(depth - 4)]
    for r in range(world):
        inner = ["evaluate (train.py:30)"] if r == odd else WAITING[:2]
        main = "main (train.py:52)" if r == odd else "main (train.py:48)"
        frames = [*inner, *layers, main, "<module> (train.py:60)"][:depth]
        (stacks / f"stack_rank{r}.txt").write_text(_stack(10000 + r, frames))
    (root / "console.log").write_text("".join(
        f"[rank{r}]:[E1122 13:{23 + r // 2000:02d}:{r % 60:02d}.941166255 "
        f"ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=7, NumelOut=7, Timeout(ms)=1800000) "
        "ran for 1800066 milliseconds before timing out.\n" for r in range(world) if r != odd))
    return root


def analyse(*paths: Path) -> Analysis:
    return run(load(list(paths)))


def script_text(doc: str) -> str:
    return doc.split("<script>", 1)[1].split("</script>", 1)[0]


def embedded_json(doc: str) -> str:
    m = re.search(r'<script type="application/json" id="ddp-autopsy-analysis">(.*?)</script>',
                  doc, re.S)
    assert m is not None
    return m.group(1)


# --------------------------------------------------------------------------- structure


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, str]:
    a = analyse(write_hang(tmp_path_factory.mktemp("hang")))
    return a, html.render(a)


@pytest.fixture(scope="module")
def crash(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, str]:
    a = analyse(write_crash(tmp_path_factory.mktemp("crash")))
    return a, html.render(a)


def test_sections_and_anchors(hang: tuple[Analysis, str]) -> None:
    a, doc = hang
    assert doc.startswith("<!doctype html>")
    for section in ("verdict", "findings", "stacks", "ranks", "timeline", "environment",
                    "inputs", "collection"):
        assert f'<section id="{section}"' in doc and f'href="#{section}"' in doc
    assert a.verdict is not None and a.verdict.rule == "COLL002"
    for f in a.findings:
        assert f'<article class="finding" id="{f.id}">' in doc
        for i in range(1, len(f.evidence) + 1):
            assert f'id="{f.id}-e{i}"' in doc and f'href="#{f.id}-e{i}"' in doc
    assert 'href="#F1"' in doc and "follows from" in doc


def test_verdict_names_the_culprit(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    verdict = doc.split('<section id="verdict"', 1)[1].split("</section>", 1)[0]
    assert "Rank 2 never reached the collective" in verdict and "Remedy." in verdict
    assert "<code>dist.barrier()</code>" in verdict  # backticks become code spans


def test_evidence_lines_are_shown_in_context(crash: tuple[Analysis, str]) -> None:
    a, doc = crash
    f = next(f for f in a.findings if f.rule == "SYM001")
    article = doc.split(f'id="{f.id}"', 1)[1].split("</article>", 1)[0]
    # The watchdog line (1) is highlighted, with the following lines (2..4) around it.
    assert f'<tr id="{f.id}-e1" class="hit"><td class="n">1</td>' in article
    assert '<td class="n">2</td><td><pre>step 3 ok</pre>' in article


def test_neighbouring_evidence_lines_share_one_window(hang: tuple[Analysis, str]) -> None:
    a, doc = hang
    f = next(f for f in a.findings if f.rule == "SYM001")
    assert [e.line for e in f.evidence] == [1, 2, 3]
    article = doc.split(f'id="{f.id}"', 1)[1].split("</article>", 1)[0]
    assert article.count('<div class="ev"') == 1 and article.count('class="hit"') == 3
    for i in (1, 2, 3):
        assert f'<tr id="{f.id}-e{i}" class="hit"><td class="n">{i}</td>' in article
        assert f'<a href="#{f.id}-e{i}">{i}</a>' in article


def test_evidence_inside_an_archive_uses_recognised_lines(tmp_path: Path) -> None:
    import tarfile

    job = write_crash(tmp_path / "job")
    with tarfile.open(tmp_path / "logs.tar.gz", "w:gz") as tf:
        tf.add(job / "console.log", arcname="console.log")
    a = analyse(tmp_path / "logs.tar.gz")
    doc = html.render(a)
    assert a.verdict is not None and a.verdict.evidence[0].path.endswith("!console.log")
    article = doc.split(f'id="{a.verdict.id}"', 1)[1].split("</article>", 1)[0]
    assert "recognised lines nearby" in article
    assert "Traceback (most recent call last)" in article and "⋯" in article
    assert "step 3 ok" not in article  # not an event: the archive is not re-read


def test_stack_evidence_shows_the_stack(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    article = doc.split('id="F1"', 1)[1].split("</article>", 1)[0]
    assert "main thread, innermost frame first" in article
    assert "all_reduce (torch/distributed/distributed_c10d.py:3252)" in article


def test_merged_stacks_and_outlier(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    stacks = doc.split('<section id="stacks"', 1)[1].split("</section>", 1)[0]
    assert "4 processes in 2 distinct stacks" in stacks
    assert "The largest group, ranks 0-1,3 (3), waits in all_reduce" in stacks
    assert 'class="badge outlier"' in stacks and 'href="#S2"' in stacks and 'id="S2"' in stacks
    assert "Other threads that run or hold the GIL" in stacks and "pin_memory" in stacks


def test_rank_grid_has_one_cell_per_rank(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    cells = re.findall(r'<i class="(\w+)" id="r(\d+)" title="([^"]*)"', doc)
    assert [int(r) for _, r, _ in cells] == [0, 1, 2, 3]
    state = {int(r): s for s, r, _ in cells}
    assert state[2] == "culprit"
    assert {state[0], state[1], state[3]} == {"failed"}  # watchdog timeouts after waiting
    assert "F1 COLL002" in dict((int(r), t) for _, r, t in cells)[2]


def test_rank_states_precedence_and_no_data(tmp_path: Path) -> None:
    a = analyse(write_hang(tmp_path / "h"))
    tree = html.stacktree.from_job(a.job)
    states = html.rank_states(a, tree)
    assert states[2][0] == "culprit" and states[0][0] == "failed"
    a.job.events = a.job.events.clear()  # no timeouts: the stacks speak
    a.findings = [f for f in a.findings if f.rule == "COLL002"]
    states = html.rank_states(a, tree)
    assert [states[r][0] for r in range(4)] == ["waiting", "waiting", "culprit", "waiting"]
    a.job.bundles = [Bundle("b", {"job": {"world_size": 6}})]
    assert html.rank_states(a, tree)[5] == ("nodata", "no input")


def test_huge_world_folds_uniform_rows(tmp_path: Path) -> None:
    a = analyse(write_hang(tmp_path / "h"))
    a.job.bundles = [Bundle("b", {"job": {"world_size": 65536}})]
    doc = html.render(a)
    assert len(doc.encode()) < 1 * MB
    assert [int(r) for r in re.findall(r'<i class="\w+" id="r(\d+)"', doc)] == list(range(64))
    assert re.search(r'<span class="band nodata" title="ranks 64-65535 · no data \(65472\)">',
                     doc)


def test_timeline_is_inline_svg(crash: tuple[Analysis, str]) -> None:
    _, doc = crash
    section = doc.split('<section id="timeline"', 1)[1].split("</section>", 1)[0]
    assert '<svg class="timeline"' in section
    assert section.count('<rect class="m ') >= 2
    assert re.search(r'<a href="#F\d+"><title>', section)  # finding markers link to findings


def test_no_verdict_and_no_stacks(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("step 0 loss 1.0\nstep 1 loss 0.5\n")
    doc = html.render(analyse(tmp_path))
    assert "No root cause found" in doc and "Nothing in the inputs looks like a failure" in doc
    assert "No stack dumps in the inputs" in doc
    assert "not evaluated: no stacks in the inputs" in doc  # COLL002, under "Not examined"
    assert "No timestamped events" in doc


def test_environment_shows_only_what_differs(tmp_path: Path) -> None:
    a = analyse(write_hang(tmp_path / "h"))
    rows = []
    for r in range(4):
        env = {"RANK": str(r), "NCCL_DEBUG": "INFO", "MASTER_ADDR": "10.0.0.1",
               "NCCL_SOCKET_IFNAME": "eth1" if r == 3 else "eth0", "DB_PASSWORD": f"hunter{r}",
               "LABEL": PROBE if r == 0 else "plain", "version.torch": "2.3.0" if r < 2 else "2.4.1",
               "version.python": "3.11.7"}
        rows += [{"host": "n1", "pid": 100 + r, "rank": r, "key": k, "value": v}
                 for k, v in env.items()]
    rows.append({"host": "n1", "pid": 99, "rank": None, "key": "MASTER_ADDR", "value": "x"})
    a.job.env = pl.DataFrame(rows, schema=ENV_SCHEMA)
    doc = html.render(a)
    section = doc.split('<section id="environment"', 1)[1].split("</section>", 1)[0]
    diff = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert "version.torch" in diff and "NCCL_SOCKET_IFNAME" in diff
    assert "2.4.1" in diff and "ranks 2-3 (2)" in diff and "rank 3 (1)" in diff
    # Same everywhere: counted, never listed (a report is shared; PATH, HOME... stay out).
    assert "MASTER_ADDR" not in section and "NCCL_DEBUG" not in section
    assert "2 environment variables identical on every process, not listed" in section
    assert diff.index("version.torch") < diff.index("NCCL_SOCKET_IFNAME")  # versions first
    assert "version.python" in section and "3.11.7" in section
    assert "Differ by design (process identity), not listed: RANK" in section
    assert "1 process without a rank (launcher agents) left out" in section
    assert "hunter" not in doc and "********" in section
    assert PROBE not in doc and "&lt;script&gt;window.__xss=1" in section


def test_collection_metadata(tmp_path: Path) -> None:
    a = analyse(write_hang(tmp_path / "h"))
    manifest = {
        "schema": "ddp-autopsy/bundle/1", "tool": {"name": "ddp-autopsy", "version": "0.1.0"},
        "host": "node7", "created": "2026-11-22T13:24:00+00:00", "duration_s": 3.2,
        "deadline_s": 60, "complete": False,
        "job": {"launcher": "torchrun", "world_size": 4, "cmdline": ["torchrun", PROBE]},
        "processes": [{"pid": 1, "role": "agent", "stack_status": "ok"},
                      {"pid": 2, "role": "worker", "stack_status": "timeout"}],
        "actions": [
            {"name": "py-spy dump 2", "kind": "command", "command": ["py-spy", "dump"],
             "status": "timeout", "exit_code": None, "duration_s": 10.0, "timeout_hit": True},
            {"name": "copy log", "kind": "file", "status": "ok", "duration_s": 0.1},
        ],
        "warnings": ["ptrace denied for pid 3"],
    }
    a.job.bundles = [Bundle("bundle-node7", manifest)]
    doc = html.render(a)
    section = doc.split('<section id="collection"', 1)[1].split("</section>", 1)[0]
    for text in ("bundle-node7", "node7", "2026-11-22T13:24:00+00:00", "1 agent, 1 worker",
                 "1 timeout", "py-spy dump 2", "timeout hit", "ptrace denied for pid 3",
                 "torchrun"):
        assert text in section, text
    assert PROBE not in doc


# --------------------------------------------------------------------------- safety


@pytest.mark.parametrize("case", ["hang", "crash"])
def test_log_text_is_escaped_everywhere(case: str, request: pytest.FixtureRequest) -> None:
    _, doc = request.getfixturevalue(case)
    assert PROBE not in doc
    assert "<script>window.__xss" not in doc and "<img" not in doc
    assert doc.count("<script") == 2  # the JSON data block and the report's own script
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;&#34;&gt;&lt;img src=x" in doc


def test_secrets_are_redacted(crash: tuple[Analysis, str]) -> None:
    a, doc = crash
    assert SECRET in a.verdict.summary  # the analysis itself keeps the log text...
    assert SECRET not in doc and "HF_TOKEN=********" in doc  # ...the shareable page does not


def test_embedded_json_cannot_break_out(crash: tuple[Analysis, str]) -> None:
    a, doc = crash
    raw = embedded_json(doc)
    assert "</" not in raw and "<!--" not in raw and "<" not in raw
    data = json.loads(raw)
    assert data["schema"] == json_report.SCHEMA_ID
    assert [f["id"] for f in data["findings"]] == [f.id for f in a.findings]
    assert PROBE in data["verdict"]["summary"]  # decoded back to the original text
    assert SECRET not in raw and "HF_TOKEN=********" in data["verdict"]["summary"]


def test_nothing_is_fetched_from_outside(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    assert not re.search(r'(?:src|href|action)\s*=\s*"(?!#|data:)', doc)
    assert "@import" not in doc and "url(" not in doc
    m = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc)
    assert m is not None
    csp = unescape(m.group(1))
    assert "default-src 'none'" in csp
    digest = base64.b64encode(hashlib.sha256(script_text(doc).encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp  # only our own script may run


def test_templates_autoescape_and_never_mark_safe() -> None:
    env = html._env()
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    templates = Path(html.__file__).parent / "templates"
    for path in templates.iterdir():
        text = path.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, path
    assert {p.name for p in templates.iterdir()} >= {"report.html.j2", "macros.html.j2",
                                                      "style.css", "report.js"}


def test_doctests() -> None:
    import doctest

    result = doctest.testmod(html)
    assert result.failed == 0 and result.attempted > 0


def test_script_json_escapes_markup() -> None:
    out = str(html.script_json({"a": "</script><!-- & \u2028"}))
    assert "<" not in out and ">" not in out and "&" not in out and "\u2028" not in out
    assert json.loads(out) == {"a": "</script><!-- & \u2028"}


# --------------------------------------------------------------------------- size, CLI


def test_4096_ranks_stay_small(tmp_path: Path) -> None:
    a = analyse(write_big(tmp_path / "big"))
    t0 = time.perf_counter()
    doc = html.render(a)
    elapsed = time.perf_counter() - t0
    size = len(doc.encode())
    assert size <= 5 * MB, size
    assert elapsed < 10, elapsed
    assert len(re.findall(r'<i class="\w+" id="r\d+"', doc)) == 4096
    assert 'id="r1234" title="rank 1234 · culprit' in doc.replace('class="culprit" ', "")
    assert "Outlier: rank 1234 in evaluate (train.py:30)" in doc
    assert len(re.findall(r'<rect class="m ', doc)) <= html.TIMELINE_MAX_MARKS


def test_cli_report_and_analyze_html(tmp_path: Path) -> None:
    job = write_crash(tmp_path / "job")
    out = tmp_path / "post-mortem.html"
    result = CliRunner().invoke(cli, ["report", str(job), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file() and "Rank 2 crashed first" in out.read_text()
    other = tmp_path / "also.html"
    result = CliRunner().invoke(cli, ["analyze", str(job), "--html", str(other), "--no-color"])
    assert result.exit_code == 0, result.output
    assert "HTML report:" in result.output and other.read_text().startswith("<!doctype html>")
