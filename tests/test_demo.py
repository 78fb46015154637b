"""`ddp-autopsy demo`, the README's first command, run for real: a 3-rank torchrun job on CPU
that hangs, real py-spy dumps, the verdict, report.html, and nothing of the job left behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from html import unescape
from pathlib import Path

import jsonschema
import pytest
from test_json_contract import SCHEMA

from ddp_autopsy.reports import html

TAG_ENV = "DDP_AUTOPSY_DEMO_TEST_TAG"
TIMEOUT_S = 240.0
NPROC = 3  # ddp_autopsy/demo: ranks of the hung job


def tagged_processes(tag: str) -> dict[int, str]:
    """Live (non-zombie) processes carrying ``TAG_ENV=tag``: ``{pid: command line}``.

    The tag is set in the demo's environment only, so it marks exactly the demo, its torchrun
    job (workers inherit it even in their own sessions) and the py-spy it runs.
    """
    marker = f"{TAG_ENV}={tag}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            found[int(entry.name)] = cmdline
    return found


def _kill_all(tag: str) -> None:
    for pid in tagged_processes(tag):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.scenario
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_demo_diagnoses_its_hang_and_cleans_up(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    tag = uuid.uuid4().hex
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    started = time.monotonic()
    seen: dict[int, str] = {}  # hung_job.py processes seen while the demo ran
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "ddp_autopsy", "demo"], cwd=tmp_path,
                                env={**os.environ, TAG_ENV: tag}, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            assert time.monotonic() - started < TIMEOUT_S, "demo did not finish"
            seen |= {p: c for p, c in tagged_processes(tag).items() if "hung_job.py" in c}
            time.sleep(0.2)
        left = tagged_processes(tag)
        deadline = time.monotonic() + 5  # SIGKILLed processes may take a moment to exit
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = tagged_processes(tag)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_all(tag)
    elapsed = time.monotonic() - started
    stdout, stderr = out.read_text(), err.read_text()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout}\n{stderr}"

    # The process scan works (launcher + 3 workers were seen) and finds nothing left.
    assert len(seen) >= NPROC + 1, f"scan saw only {seen}"
    assert not left, f"demo left processes running: {left}"

    # hung_job.py: rank 0 loops in evaluate() while ranks 1-2 wait in all_reduce.
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines[1].startswith("VERDICT"), stdout
    assert "rank 0" in lines[1].lower() and "evaluate" in lines[1] and "hung_job.py" in lines[1]
    assert lines[2].split()[0] == "rank_stuck_outside_collective", lines[2]
    assert re.search(r"· rank 0(?: ·|$)", lines[2]), lines[2]
    assert "evaluate (ddp_autopsy/demo/hung_job.py:" in stdout  # the py-spy evidence
    assert (tmp_path / "ddp-autopsy-demo" / "bundle" / "manifest.json").is_file()

    # report.html: the same verdict, and nothing fetched from elsewhere.
    doc = (tmp_path / "report.html").read_text()
    data = html.embedded_analysis(doc)  # the per-rank lists are embedded by column
    jsonschema.validate(data, SCHEMA)
    verdict = data["verdict"]
    assert verdict["cause"] == "rank_stuck_outside_collective" and verdict["ranks"] == [0]
    assert "evaluate" in verdict["summary"]
    assert not re.search(r'(?:src|href|action)\s*=\s*"(?!#|data:)', doc)
    assert "@import" not in doc and "url(" not in doc
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc)
    assert csp is not None and "default-src 'none'" in unescape(csp.group(1))
    print(f"demo took {elapsed:.1f} s")
