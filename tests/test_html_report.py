"""The HTML post-mortem (reports/html.py + reports/templates): content, escaping, bounds.

The browser-level checks (console errors, inert XSS probe, screenshots, load time) are in
test_html_browser.py; the helpers that write fixture jobs live here and are shared with it.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
from datetime import datetime, timedelta
from html import unescape
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from click.testing import CliRunner
from markupsafe import escape

from ddp_autopsy.analyzer.events import EVENT_SCHEMA
from ddp_autopsy.analyzer.job import ENV_SCHEMA, Bundle, load
from ddp_autopsy.cli import main as cli
from ddp_autopsy.redact import redact_obj
from ddp_autopsy.reports import html, json_report
from ddp_autopsy.reports.html import columns
from ddp_autopsy.rules.engine import Analysis, run

#: Planted in log lines, stack frames, env values, host and thread names and file paths; must
#: stay inert text everywhere.
PROBE = '<script>window.__xss=1</script>"><img src=x onerror="window.__xss=2">'
ESCAPED = str(escape(PROBE))
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


def write_port_in_use(root: Path) -> Path:
    """torchrun's console when the master port is taken (the last lines of the real
    ``port_in_use`` scenario's console)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "console.log").write_text(
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/'
        'static_tcp_rendezvous.py", line 67, in next_rendezvous\n'
        "    self._store = TCPStore(  # type: ignore[call-arg]\n"
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. port: 29284, useIpv6: false, code: -98, name: EADDRINUSE, "
        "message: address already in use\n")
    return root


def _json_frames(frames: list[tuple[str, str, int]]) -> list[dict[str, object]]:
    return [{"name": f, "filename": fl, "short_filename": fl, "line": ln} for f, fl, ln in frames]


def write_probe_bundle(root: Path, world: int = 4, odd: int = 2) -> Path:
    """A collect bundle (the layout ``collect`` writes) with the probe in its host name, in
    its own path (the ``/`` in the probe makes two directories, so every path under it holds
    the probe whole), in a thread name on every rank and in the file name of rank ``odd``'s
    innermost frame. The others wait in all_reduce; the console log has their timeouts."""
    bundle = root / PROBE / "bundle"
    wait = [("all_reduce", "torch/distributed/distributed_c10d.py", 3252),
            ("main", "train.py", 48), ("<module>", "train.py", 60)]
    odd_frames = [("evaluate", f"{PROBE}/eval.py", 30), ("main", "train.py", 52),
                  ("<module>", "train.py", 60)]
    procs = []
    for r in range(world):
        pid = 4240 + r
        d = bundle / "processes" / str(pid)
        d.mkdir(parents=True)
        threads = [
            {"pid": pid, "thread_id": 1, "os_thread_id": pid, "thread_name": "MainThread",
             "active": False, "owns_gil": False,
             "frames": _json_frames(odd_frames if r == odd else wait)},
            {"pid": pid, "thread_id": 2, "os_thread_id": 9000 + r, "thread_name": PROBE,
             "active": True, "owns_gil": False,
             "frames": _json_frames([("poll", "worker.py", 12), ("run", "threading.py", 975)])},
        ]
        (d / "stack.json").write_text(json.dumps(threads))
        procs.append({"pid": pid, "ppid": 4200, "role": "worker", "rank": r, "local_rank": r,
                      "world_size": world, "stack": f"processes/{pid}/stack.json",
                      "stack_status": "ok"})
    (bundle / "logs").mkdir()
    (bundle / "logs" / "console.log").write_text("".join(
        f"[rank{r}]:[E1122 13:23:{24 + r:02d}.941166255 ProcessGroupNCCL.cpp:616] [Rank {r}] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
        "NumelIn=7, NumelOut=7, Timeout(ms)=1800000) ran for 1800066 milliseconds before "
        "timing out.\n" for r in range(world) if r != odd))
    manifest = {
        "schema": "ddp-autopsy/bundle/1", "tool": {"name": "ddp-autopsy", "version": "0.1.0"},
        "host": PROBE, "created": "2026-11-22T13:24:00+00:00", "complete": True,
        "job": {"launcher": "torchrun", "world_size": world}, "processes": procs,
        "logs": [{"source": "/w/console.log", "path": "logs/console.log", "pids": [4200]}],
        "actions": [], "warnings": [],
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


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


def section(doc: str, name: str) -> str:
    return doc.split(f'<section id="{name}"', 1)[1].split("</section>", 1)[0]


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
    for section in ("verdict", "findings", "stacks", "ranks", "timeline", "inputs",
                    "collection"):
        assert f'<section id="{section}"' in doc and f'href="#{section}"' in doc
    # Logs and stacks, no bundle: no environment section, one line says why.
    assert '<section id="environment"' not in doc and 'href="#environment"' not in doc
    assert "Not in the inputs: <b>versions and environment</b>" in doc
    assert a.verdict is not None and a.verdict.rule == "COLL002"
    for f in a.findings:
        assert re.search(f'<article class="finding[^"]*" id="{f.id}">', doc)
        for i in range(1, len(f.evidence) + 1):
            assert f'id="{f.id}-e{i}"' in doc and f'href="#{f.id}-e{i}"' in doc
    assert 'href="#F1"' in doc and "follows from" in doc


def test_verdict_names_the_culprit(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    verdict = doc.split('<section id="verdict"', 1)[1].split("</section>", 1)[0]
    assert "Rank 2 never reached the collective" in verdict and "Remedy." in verdict
    assert '<code class="nw">dist.barrier()</code>' in verdict  # code spans, unbroken


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
    states = html.rank_states(a)
    assert states[2][0] == "culprit" and states[0][0] == "failed"
    a.job.events = a.job.events.clear()  # no timeouts: the stacks speak
    a.findings = [f for f in a.findings if f.rule == "COLL002"]
    states = html.rank_states(a)
    assert [states[r][0] for r in range(4)] == ["waiting", "waiting", "culprit", "waiting"]
    a.job.bundles = [Bundle("b", {"job": {"world_size": 6}})]
    a.job.forget()  # the world size comes from the bundles, not a frame
    assert html.rank_states(a)[5] == ("nodata", "no input names this rank")


def test_huge_world_folds_uniform_rows(tmp_path: Path) -> None:
    a = analyse(write_hang(tmp_path / "h"))
    a.job.bundles = [Bundle("b", {"job": {"world_size": 65536}})]
    a.job.forget()  # the derived facts (the rank table) were built for the job before the change
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
    assert re.search(r'<a href="#F\d+"><g class="flag fl"><title>', section)  # link to findings


def _timeline(doc: str) -> tuple[list[str], str, dict[str, list[str]]]:
    """The SVG timeline's lane labels (top to bottom), its caption, and the titles of the
    marks drawn on each lane (by the mark's y, not by its title)."""
    tl = section(doc, "timeline")
    caption = re.search(r'<p class="muted small">([^<]*)</p>', tl)
    assert caption is not None
    lanes = {float(y) - 4: label for y, label in
             re.findall(r'<text class="lane-label" x="[\d.]+" y="([\d.]+)"[^>]*>([^<]*)</text>', tl)}
    marks: dict[str, list[str]] = {label: [] for label in lanes.values()}
    for y, title in re.findall(r'<rect class="m \w+" x="[\d.]+" y="([\d.]+)"[^>]*><title>'
                               r'([^<]*)</title>', tl):
        marks[lanes[float(y) + 6]].append(unescape(title))
    return [lanes[y] for y in sorted(lanes)], caption.group(1), marks


def _events(rows: list[tuple[int | None, str | None]]) -> pl.DataFrame:
    """One watchdog timeout per (rank, host), a second apart."""
    t0 = datetime(2026, 11, 22, 13, 0)
    return pl.DataFrame([{"source": "console.log", "line": i + 1, "kind": "watchdog_timeout",
                          "rank": r, "host": h, "ts": t0 + timedelta(seconds=i),
                          "text": f"event {i} rank {r} host {h}"}
                         for i, (r, h) in enumerate(rows)], schema=EVENT_SCHEMA)


LANE_CASES = {
    # <= 32 ranks: a lane per rank (numeric order); host-only and anonymous events after them.
    "per-rank": ([(10, "n1"), (2, "n1"), (0, "n2"), (None, "n1"), (None, None)],
                 ["rank 0", "rank 2", "rank 10", "host n1", "launcher / other"], "per rank"),
    # > 32 ranks on <= 32 hosts: a lane per host.
    "per-host": ([(r, f"node{r % 4}") for r in range(40)] + [(None, None)],
                 ["node0", "node1", "node2", "node3", "launcher / other"], "per host"),
    # > 32 ranks on > 32 hosts: 32 blocks over ranks 0..max.
    "per-block": ([(r, f"n{r}") for r in [*range(0, 4096, 64), 4095]] + [(None, "n0")],
                  [f"ranks {b}-{b + 127}" for b in range(0, 4096, 128)] + ["launcher / other"],
                  "per block of 128 ranks"),
    "per-block-small": ([(r, f"n{r}") for r in range(100)],
                        [f"ranks {b}-{b + 3}" for b in range(0, 100, 4)],
                        "per block of 4 ranks"),
    "no-rank-no-host": ([(None, None)] * 3, ["launcher / other"], "in one lane"),
}


@pytest.mark.parametrize("case", list(LANE_CASES))
def test_timeline_lanes(case: str, tmp_path: Path) -> None:
    rows, want, how = LANE_CASES[case]
    a = analyse(write_hang(tmp_path / "h"))
    a.job.events = _events(rows)
    lanes, caption, marks = _timeline(html.render(a))
    assert lanes == want
    assert f"{len(rows)} timestamped events {how}," in caption
    # Every event is drawn, on the lane its title names.
    for lane, titles in marks.items():
        assert titles and all(t.startswith(f"{lane} · ") for t in titles), (lane, titles)
    assert sum(int(m.group(1)) if (m := re.search(r" ×(\d+):", t)) else 1
               for titles in marks.values() for t in titles) == len(rows)
    if case == "per-block":  # ranks 3968, 4032 and 4095 share the last block; no rank: "other"
        assert sorted(t.rsplit(": ", 1)[1] for t in marks["ranks 3968-4095"]) == [
            f"event {i} rank {r} host n{r}" for i, r in ((62, 3968), (63, 4032), (64, 4095))]
        assert [t.rsplit(": ", 1)[1] for t in marks["launcher / other"]] == [
            "event 65 rank None host n0"]


def test_no_verdict_and_no_stacks(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("step 0 loss 1.0\nstep 1 loss 0.5\n")
    doc = html.render(analyse(tmp_path))
    assert "No root cause found" in doc and "Nothing in the inputs looks like a failure" in doc
    # Empty sections are left out; one line says what is missing and how to get it.
    for name in ("stacks", "timeline", "environment"):
        assert f'<section id="{name}"' not in doc and f'href="#{name}"' not in doc
    absent = doc.split('id="absent">', 1)[1].split("</p>", 1)[0]
    assert "<b>stack dumps</b> (run ddp-autopsy collect" in absent
    assert "<b>a timeline</b>" in absent and "<b>versions and environment</b>" in absent
    assert "not evaluated: no stack dumps in the inputs" in doc  # COLL002, under "Not examined"


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
                 "torchrun", "<dd>3.20 s</dd>", "<dd>60 s</dd>", "<dd>no: some steps"):
        assert text in section, text
    assert "<dd>False</dd>" not in section and "<dd>3.2</dd>" not in section
    assert PROBE not in doc


def test_verdict_is_shown_once(hang: tuple[Analysis, str]) -> None:
    a, doc = hang
    assert a.verdict is not None
    summary = str(escape(a.verdict.summary))
    assert summary in section(doc, "verdict")
    findings = section(doc, "findings")
    assert summary not in findings and a.verdict.remedy[:40] not in findings
    # Its evidence in context is still there (folded), anchors and all.
    fold = findings.split('<details class="ev-fold', 1)[1].split("</details>", 1)[0]
    for i in range(1, len(a.verdict.evidence) + 1):
        assert f'id="{a.verdict.id}-e{i}"' in fold


def test_not_examined_says_what_is_missing_and_how_to_get_it(
        hang: tuple[Analysis, str]) -> None:
    a, doc = hang
    inputs = section(doc, "inputs")
    assert "no collectives" not in inputs
    row = next(r for r in inputs.split("<tr>") if "COLL005" in r)
    for code in ("COLL005", "COLL006", "COLL007", "COLL008"):  # one row for one reason
        assert code in row
    assert "no Flight Recorder dumps" in row and "TORCH_FR_BUFFER_SIZE=2000" in row
    assert "TORCH_FR_DUMP_ON_TIMEOUT=1" in row
    # The terminal words it the same way (reports/wording.py).
    from ddp_autopsy.reports import wording
    fr = next(o for o in a.outcomes if o.rule == "COLL005")
    assert "no Flight Recorder dumps" in wording.not_examined(fr)
    # Ruled out: a count, the list folded.
    ruled = [o for o in a.outcomes if o.status == "ruled_out"]
    m = re.search(r'<details class="small ruled-out[^"]*"><summary><b>Ruled out: (\d+) rules',
                  inputs)
    assert m is not None and int(m.group(1)) == len(ruled) > 10


def test_rank_table_groups_ranks_and_marks_the_culprit(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    ranks = section(doc, "ranks")
    rows = re.findall(r'<tr class="st-(\w+)( culprit-row)?"><td data-v="(\d+)" class="rk">'
                      r"([^<]+)", ranks)
    assert [(st, bool(c), first, label.strip()) for st, c, first, label in rows] == [
        ("busy", True, "2", "2"), ("failed", False, "0", "0-1,3")]
    assert ranks.count("culprit</span>") == 1
    assert "(train.py:31)" in ranks.split("culprit-row", 1)[1].split("</tr>", 1)[0]


def test_bundle_logs_read_from_summaries_have_their_size(tmp_path: Path) -> None:
    from ddp_autopsy.analyzer.job import load
    from ddp_autopsy.collectors import summaries

    bundle = write_probe_bundle(tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["summaries"] = summaries.write(bundle)  # as collect does
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    job = load([bundle])
    assert not any(i.path.endswith("summaries") for i in job.inputs)
    logs = [i for i in job.inputs if i.kind == "log"]
    assert logs and all(i.bytes == (bundle / "logs" / "console.log").stat().st_size
                        for i in logs)


def _extents(svg: str, cls: str) -> list[tuple[float, float, float]]:
    """(y, left, right) of each label of class ``cls`` (its width estimated from its length)."""
    out = []
    for x, y, anchor, text in re.findall(
            rf'<g class="{cls}"><title>[^<]*</title><line[^>]*/><text x="([\d.]+)" '
            r'y="([\d.]+)" text-anchor="(\w+)">([^<]*)</text>', svg):
        w = len(unescape(text)) * 6.2
        left = float(x) - (w if anchor == "end" else w / 2 if anchor == "middle" else 0)
        out.append((float(y), left, left + w))
    return out


def _overlaps(boxes: list[tuple[float, float, float]]) -> list[tuple]:
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[0] == b[0] and a[1] < b[2] and b[1] < a[2]]


def test_timeline_tells_the_story(tmp_path: Path) -> None:
    """Collection moment, each rank's last line, the first failure, the silent culprit's lane,
    and the half minute between the timeouts and the collection cut out."""
    a = analyse(write_probe_bundle(tmp_path / "b"))
    assert a.verdict is not None and a.verdict.ranks == [2]
    tl = section(html.render(a), "timeline")
    assert re.search(r'<g class="flag collected"><title>collected on [^<]* at '
                     r"2026-11-22 \d\d:24:00</title>", tl)
    assert '<g class="flag first"><title>first failure' in tl
    lanes, _, marks = _timeline(html.render(a))
    assert lanes == ["rank 0", "rank 1", "rank 2", "rank 3"]
    for lane in ("rank 0", "rank 1", "rank 3"):
        assert any(" · last_line: " in t for t in marks[lane]), (lane, marks[lane])
    assert marks["rank 2"] == [] and "no line from this rank" in tl
    y2 = float(re.findall(r'y="([\d.]+)" text-anchor="end">rank 2<', tl)[0])
    assert f'<text class="lane-culprit" x="4" y="{y2:.1f}">culprit</text>' in tl
    assert '<g class="gap">' in tl  # 13:23:27 → 13:24:00: no event, drawn cut
    assert "ddp-autopsy export --format perfetto PATHS -o trace.json" in tl


@pytest.mark.parametrize("span", [timedelta(milliseconds=1), timedelta(hours=3)])
def test_timeline_labels_never_overlap(span: timedelta, tmp_path: Path) -> None:
    a = analyse(write_hang(tmp_path / "h"))
    t0 = datetime(2026, 11, 22, 13, 0)
    # Bursts at the start, a few in the middle and at the end; findings close together.
    offsets = [0, 0.001, 0.002, 0.5, 0.51, 0.97, 0.98, 0.99, 1.0]
    a.job.events = pl.DataFrame([{"source": "c.log", "line": i + 1, "kind": "watchdog_timeout",
                                  "rank": i % 4, "ts": t0 + span * f, "text": f"e{i}"}
                                 for i, f in enumerate(offsets)], schema=EVENT_SCHEMA)
    for f, off in zip(a.findings, (0.98, 0.99, 1.0), strict=False):
        f.ts = t0 + span * off
    tl = section(html.render(a), "timeline")
    ticks = [(0.0, float(x) - len(unescape(t)) * 3.1, float(x) + len(unescape(t)) * 3.1)
             for x, t in re.findall(r'<text class="tick" x="([\d.]+)"[^>]*>([^<]*)</text>', tl)]
    assert len(ticks) >= 3 and _overlaps(ticks) == []
    flags = _extents(tl, "flag fl") + _extents(tl, "flag first")
    assert len(flags) == min(3, len(a.findings)) + 1 and _overlaps(flags) == []
    xs = [float(x) for x in re.findall(r'<rect class="m \w+" x="([\d.]+)"', tl)]
    assert max(xs) - min(xs) > 300  # the marks spread over the plot, not in its last pixels


def test_icicle_is_the_tree_drawn_to_scale(hang: tuple[Analysis, str]) -> None:
    _, doc = hang
    stacks = section(doc, "stacks")
    svg = stacks.split('<svg class="icicle"', 1)[1].split("</svg>", 1)[0]
    rects = re.findall(r'<g class="ic ([\w ]+)"><title>([^<]*)</title><rect x="([\d.]+)" '
                       r'y="(\d+)" width="([\d.]+)"', svg)
    rows: dict[int, float] = {}
    for _, _, _, y, w in rects:
        rows[int(y)] = rows.get(int(y), 0) + float(w)
    assert rows[0] == pytest.approx(1000)  # <module>: every process
    assert all(total <= 1000.01 for total in rows.values())
    outliers = [(unescape(t), float(w)) for cls, t, _, _, w in rects if "outlier" in cls]
    # Rank 2 (1 of 4 processes) in evaluate: its own frames, a quarter wide, in red.
    assert outliers and all(w == pytest.approx(250) for _, w in outliers)
    assert any(t.startswith("evaluate (train.py:30)") for t, _ in outliers)
    assert all("rank 2 (1, 25%)" in t for t, _ in outliers)
    assert any("all_reduce" in unescape(t) and "coll" in cls for cls, t, *_ in rects)


# --------------------------------------------------------------------------- safety


@pytest.mark.parametrize("case", ["hang", "crash"])
def test_log_text_is_escaped_everywhere(case: str, request: pytest.FixtureRequest) -> None:
    _, doc = request.getfixturevalue(case)
    assert PROBE not in doc
    assert "<script>window.__xss" not in doc and "<img" not in doc
    assert doc.count("<script") == 2  # the JSON data block and the report's own script
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;&#34;&gt;&lt;img src=x" in doc


@pytest.fixture(scope="module")
def probe_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, str]:
    a = analyse(write_probe_bundle(tmp_path_factory.mktemp("probe")))
    return a, html.render(a)


def test_probes_in_hosts_threads_and_paths_stay_inert(
        probe_bundle: tuple[Analysis, str]) -> None:
    a, doc = probe_bundle
    # The probe reached the analysis: host, paths, the outlier's frame.
    assert a.verdict is not None and a.verdict.rule == "COLL002" and a.verdict.hosts == [PROBE]
    assert len(a.job.inputs) == 6 and all(PROBE in i.path for i in a.job.inputs)
    # It is shown, as text only.
    assert PROBE not in doc and "<img" not in doc and doc.count("<script") == 2
    stacks = section(doc, "stacks")
    assert f'<span class="thread">thread “{ESCAPED}”</span>' in stacks  # thread name
    assert f'<span class="loc">{ESCAPED}/eval.py:30</span>' in stacks  # frame file name
    assert f'title="evaluate ({ESCAPED}/eval.py:30)"' in stacks
    findings = section(doc, "findings")
    # Evidence paths: every block's location (a stack dump's path, the log's path).
    locs = re.findall(r'<span class="loc">(?:<a href="#F\d+-e\d+">)?([^<]*)', findings)
    assert len(locs) == 3 and all(ESCAPED in loc for loc in locs), locs
    assert f"host {ESCAPED}" in findings and f"rank 0 · {ESCAPED}" in findings
    inputs = re.findall(r'<td class="path">([^<]*)</td>', section(doc, "inputs"))
    assert len(inputs) == 6 and all(ESCAPED in p for p in inputs)  # input paths
    host = escape(html.clean(PROBE, 60))  # grid tooltips cut host names at 60 characters
    assert section(doc, "ranks").count(f'title="rank 2 · {host} · ') == 1
    collection = section(doc, "collection")
    assert f"<dt>host</dt><dd>{ESCAPED}</dd>" in collection
    assert f"{ESCAPED}/bundle</h3>" in collection


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
    templates = Path(html.__file__).parents[1] / "templates"
    for path in templates.iterdir():
        text = path.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, path
    assert {p.name for p in templates.iterdir()} >= {"report.html.j2", "macros.html.j2",
                                                      "style.css", "report.js"}


def test_doctests() -> None:
    import doctest

    from ddp_autopsy.reports.html import common

    for module in (common, columns):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module


def test_script_json_escapes_markup() -> None:
    out = str(html.script_json({"a": "</script><!-- & \u2028"}))
    assert "<" not in out and ">" not in out and "&" not in out and "\u2028" not in out
    assert json.loads(out) == {"a": "</script><!-- & \u2028"}


# --------------------------------------------------------------------------- size, CLI


def test_4096_ranks_stay_small(tmp_path: Path) -> None:
    a = analyse(write_big(tmp_path / "big"))
    doc = html.render(a)  # its time is measured in docs/report.md, not asserted (loaded CI)
    size = len(doc.encode())
    assert size <= 5 * MB, size
    assert len(re.findall(r'<i class="\w+" id="r\d+"', doc)) == 4096
    assert 'id="r1234" title="rank 1234 · culprit' in doc.replace('class="culprit" ', "")
    assert "Outlier: rank 1234 in evaluate (train.py:30)" in doc
    assert len(re.findall(r'<rect class="m ', doc)) <= html.TIMELINE_MAX_MARKS
    # The per-rank lists are embedded by column: small, and every row comes back.
    raw = json.loads(embedded_json(doc))
    assert len(json.dumps(raw["ranks"], ensure_ascii=False)) < 600_000
    data = html.embedded_analysis(doc)
    want = redact_obj(json.loads(json_report.render(a)))
    assert data["ranks"] == want["ranks"] and len(data["ranks"]["table"]) == 4096
    jsonschema.validate(data, json.loads(
        (Path(json_report.__file__).parent.parent / "schemas" / "analysis.schema.json")
        .read_text()))


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


# --------------------------------------------------------------------------- timeline: FR, zoom


def test_timeline_draws_each_ranks_flight_recorder_position(tmp_path: Path) -> None:
    """Ranks 0 and 2 started all_reduce #5 and never completed it (a bar to the end of the
    plot); rank 1 last completed #4."""
    from test_perfetto import write_job

    a = analyse(write_job(tmp_path / "job"))
    doc = html.render(a)
    _, caption, marks = _timeline(doc)
    assert "Flight Recorder position" in caption
    for lane in ("rank 0", "rank 2"):
        assert any("fr_pending: " in t and "started, never completed: #5 " in t
                   for t in marks[lane]), marks[lane]
    assert any("fr_completed: " in t and "last completed #4 " in t for t in marks["rank 1"])
    assert not any("fr_pending" in t for t in marks["rank 1"])
    tl = section(doc, "timeline")
    bars = re.findall(r'<rect class="pend" data-x="([\d.]+)" data-w="([\d.]+)"', tl)
    assert len(bars) == 2
    right = html.timeline.TL_WIDTH - html.timeline.TL_RIGHT
    assert all(abs(float(x) + float(w) - right) < 0.2 for x, w in bars)  # open to the end
    # The axis report.js zooms with: segments in plot x and ms, ending at the plot's right.
    axis = json.loads(unescape(re.search(r'data-axis="([^"]*)"', tl).group(1)))  # type: ignore[union-attr]
    assert axis[0][0] == html.timeline.TL_LEFT and axis[-1][1] == right
    assert all(a[1] <= b[0] + 1e-6 and a[3] <= b[2] for a, b in itertools.pairwise(axis))


def test_untimed_last_lines_are_written_in_their_lanes(tmp_path: Path) -> None:
    """A hang whose ranks print lines without a timestamp (torchrun's tee): each rank's last
    line is written in its lane, not lost with the untimed events."""
    job = write_hang(tmp_path / "job", world=3, odd=1)
    with (job / "console.log").open("a") as fh:
        fh.write("[rank0]:step 7 loss 0.25\n[rank2]:step 7 loss 0.26\n")
    tl = section(html.render(analyse(job)), "timeline")
    texts = re.findall(r'<text class="lane-untimed" data-x="[\d.]+" x="[\d.]+" y="([\d.]+)">'
                       r"([^<]*)</text>", tl)
    lanes = {float(y) + 4: label for y, label in
             re.findall(r'<text class="lane-label" x="[\d.]+" y="([\d.]+)"[^>]*>([^<]*)<', tl)}
    got = {lanes[float(y) + 4]: t for y, t in texts}
    assert got == {"rank 0": "last line, no time: [rank0]:step 7 loss 0.25",
                   "rank 2": "last line, no time: [rank2]:step 7 loss 0.26"}, got


def test_tick_labels_differ_from_their_neighbours(tmp_path: Path) -> None:
    """A 1 ms burst 0.74 s after the first event: the ticks inside it still differ."""
    a = analyse(write_hang(tmp_path / "h"))
    t0 = datetime(2026, 11, 22, 13, 0)
    offsets = [0, 0.742, 0.7421, 0.7425, 0.7428, 0.743]
    a.job.events = pl.DataFrame([{"source": "c.log", "line": i + 1, "kind": "closing_signal",
                                  "rank": None, "ts": t0 + timedelta(seconds=f),
                                  "text": f"e{i}"} for i, f in enumerate(offsets)],
                                schema=EVENT_SCHEMA)
    tl = section(html.render(a), "timeline")
    labels = re.findall(r'<text class="tick" x="[\d.]+"[^>]*>([^<]*)</text>', tl)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels


COLUMN_CASES = {
    "empty": [],
    "one": [{"a": 1, "b": None, "c": "x"}],
    "mixed": [{"n": v, "s": t, "l": lst} for v, t, lst in [
        (1, "", [1]), (True, None, [1]), (1.0, "abc", []), (None, "abc", None), (2, "xabcx", [2]),
        (3, "é😀 ab", ["a"]), (4, "é😀 ab", ["a"]), (0, "ab", ["a"]), (-5, None, None)]],
    "ranges": [{"rank": r, "pid": 100 + 2 * r if r % 7 else None, "host": f"n{r // 8}",
                "t": f"2026-11-22T13:{r // 60:02d}:{r % 60:02d}"} for r in range(200)],
}


@pytest.mark.parametrize("case", list(COLUMN_CASES))
def test_columns_round_trip_exactly(case: str) -> None:
    rows = COLUMN_CASES[case]
    table = json.loads(json.dumps(columns.encode(rows)))  # through JSON, as embedded
    back = columns.decode(table)
    assert back == rows
    # Types survive too (True is not 1, 1.0 is not 1).
    assert [[type(v) for v in r.values()] for r in back] == \
        [[type(v) for v in r.values()] for r in rows]
    with pytest.raises(ValueError):
        columns.decode({**table, "encoding": "rows"})


def test_rank_table_leaves_out_columns_no_row_fills(tmp_path: Path) -> None:
    """Stacks only: no rank has a log line, so neither 'last log line' nor 'at' is a column."""
    job = write_hang(tmp_path / "job")
    (job / "console.log").unlink()
    ranks = section(html.render(analyse(job)), "ranks")
    heads = re.findall(r'<th data-sort="\w">([^<]*)</th>', ranks)
    assert heads == ["ranks", "state", "pid", "doing (frame, or collective #seq)"], heads
    row = re.search(r'<tr class="st-[^"]*">(.*?)</tr>', ranks, re.S)
    assert row is not None and row.group(1).count("<td") == len(heads)
    # With the console, rank 0 (a row of its own) has its last line and its time.
    full = section(html.render(analyse(write_hang(tmp_path / "full", world=2, odd=1))),
                   "ranks")
    assert {"last log line", "at", "pid"} <= set(re.findall(r'<th data-sort="\w">([^<]*)</th>',
                                                         full))


def test_long_code_spans_break_only_between_words(tmp_path: Path) -> None:
    doc = html.render(analyse(write_port_in_use(tmp_path / "job")))
    verdict = section(doc, "verdict")
    assert "port 29284" in verdict
    assert '<span class="nw">--master-port</span>' in verdict
