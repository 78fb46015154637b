"""The stack fallback when py-spy fails (``collectors/pyspy.fallback``, issue #14).

Real processes throughout: Python programs that register ``faulthandler`` (or not), a pipe for
stderr, and a hung torchrun job collected with py-spy made unusable the honest way
(``DDP_AUTOPSY_PYSPY`` pointing at a program that fails), then analyzed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_autopsy.collectors import faulthandler, pyspy

DECLARED = {faulthandler.ENV_VAR: "SIGUSR1"}

# A program in a known place: the main thread sleeps in inner() called from <module>, a thread
# named "bg" in worker(); with --chatty a third thread writes a line every 10 ms to stdout.
PROGRAM = """
import faulthandler, signal, sys, threading, time
if "--register" in sys.argv:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
if "--other-handler" in sys.argv:  # a handler of its own, not faulthandler
    signal.signal(signal.SIGUSR1, lambda *_: print("handled", flush=True))
def worker():
    while True:
        time.sleep(0.05)
def chatter():
    while True:
        print("job line", flush=True)
        time.sleep(0.01)
threading.Thread(target=worker, name="bg", daemon=True).start()
if "--chatty" in sys.argv:
    threading.Thread(target=chatter, daemon=True).start()
def inner():
    print("READY", flush=True)
    while True:
        time.sleep(0.05)
inner()
"""


def _pythons() -> list[str]:
    """This interpreter and, where installed, the oldest and newest pyenv CPython (the dump
    format is checked on each)."""
    found = [sys.executable]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for pattern in ("3.8*", "3.13*"):
        found += sorted(glob.glob(f"{root}/versions/{pattern}/bin/python3"))[:1]
    return found


@contextlib.contextmanager
def program(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
            python: str = sys.executable, stdout: int | None = None,
            ) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The program running, its stdout and stderr in ``tmp_path/out.log`` (or a pipe)."""
    log = tmp_path / "out.log"
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([python, str(script), *args], stdout=stdout or fh,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if stdout is None and "READY" in log.read_text():
                break
            if stdout is not None:  # a pipe: read the READY line from it
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == b"READY"
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        yield proc, log
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("python", _pythons(), ids=lambda p: p.split("/versions/")[1].split(
    "/")[0] if "/versions/" in p else "this")
def test_faulthandler_dump_read_back_as_pyspy_threads(tmp_path: Path, python: str) -> None:
    with program(tmp_path, "--register", env=DECLARED, python=python) as (proc, log):
        got = faulthandler.take(proc.pid, None, timeout=30, own_env={})
        assert got.status == "ok", got.detail
        assert proc.poll() is None  # the job lives on
    assert "SIGUSR1" in got.detail and "job's environment" in got.detail
    assert got.threads is not None and len(got.threads) == 2
    main = got.threads[-1]
    assert main["os_thread_id"] == proc.pid and main["thread_name"] == "MainThread"
    assert [f["name"] for f in main["frames"]] == ["inner", "<module>"]
    assert main["frames"][0]["filename"].endswith("prog.py") and main["frames"][0]["line"] > 0
    assert [f["name"] for f in got.threads[0]["frames"]][:2] == ["worker", "run"]
    # what take() read is what faulthandler wrote into the job's log, nothing else
    assert got.text is not None and got.text in log.read_text()
    assert [w.foreign for w in got.written] == [0]


def test_job_output_in_the_same_file_is_skipped_and_counted(tmp_path: Path) -> None:
    """A job that keeps writing to the file the dump goes to: the dump is still parsed, the
    job's own lines are counted as its output (the watcher's progress), not as the dump."""
    with program(tmp_path, "--register", "--chatty", env=DECLARED) as (proc, _log):
        got = faulthandler.take(proc.pid, None, timeout=30, own_env={})
    assert got.status == "ok", got.detail
    assert got.threads is not None and got.threads[-1]["frames"][0]["name"] == "inner"
    assert len(got.written) == 1 and got.written[0].foreign > 0
    w = got.written[0]
    assert w.end - w.start > w.foreign


def test_signal_declared_by_the_tool_environment(tmp_path: Path) -> None:
    with program(tmp_path, "--register") as (proc, _log):
        got = faulthandler.take(proc.pid, {}, timeout=30, own_env={faulthandler.ENV_VAR: "usr1"})
    assert got.status == "ok" and "tool's environment" in got.detail, got.detail


def test_no_signal_is_sent_without_declaration_or_handler(tmp_path: Path) -> None:
    """Undeclared: nothing sent. Declared but not registered in this process (SIGUSR1 would kill
    it): nothing sent, and the process lives."""
    with program(tmp_path, "--register") as (proc, log):
        got = faulthandler.take(proc.pid, {}, timeout=5, own_env={})
        time.sleep(0.3)
        assert got.status == "unavailable" and "not set" in got.detail
        assert "most recent call first" not in log.read_text()
    with program(tmp_path, env=DECLARED) as (proc, _log):
        got = faulthandler.take(proc.pid, None, timeout=5, own_env={})
        assert got.status == "unavailable" and "no handler" in got.detail, got.detail
        time.sleep(0.3)
        assert proc.poll() is None, "the process was signalled"
    bad = faulthandler.take(os.getpid(), {faulthandler.ENV_VAR: "SIGNOPE"}, own_env={})
    assert bad.status == "unavailable" and "is not SIGUSR1" in bad.detail
    assert faulthandler.parse_signal("SIGINT") is None  # Python catches it: KeyboardInterrupt
    assert faulthandler.parse_signal("15") is None


def test_a_handler_that_is_not_faulthandler_is_signalled_once(tmp_path: Path) -> None:
    """Declared, and SigCgt shows a handler, but it is the job's own: no dump appears. That is
    said, and the process is not signalled again (a watcher samples every round)."""
    with program(tmp_path, "--other-handler", env=DECLARED) as (proc, log):
        first = faulthandler.take(proc.pid, None, timeout=2, own_env={})
        second = faulthandler.take(proc.pid, None, timeout=2, own_env={})
        time.sleep(0.3)
        assert proc.poll() is None
        assert log.read_text().count("handled") == 1
    assert first.status == "error" and "no faulthandler dump appeared" in first.detail
    assert second.status == "error" and second.detail.endswith("(not sent again)")


def test_output_to_a_pipe_is_not_triggered(tmp_path: Path) -> None:
    """faulthandler writing to a pipe cannot be read back: the signal is not sent at all."""
    with program(tmp_path, "--register", env=DECLARED, stdout=subprocess.PIPE) as (proc, _l):
        got = faulthandler.take(proc.pid, None, timeout=5, own_env={})
        assert got.status == "unavailable" and "pipe:" in got.detail, got.detail
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        time.sleep(0.3)
        assert not proc.stdout.read(), "a dump was written to the pipe"


def test_fallback_order_and_reasons(tmp_path: Path) -> None:
    """Below 3.15 the interpreter's own dump is skipped, with the reason; faulthandler follows.
    A process that is not Python is never signalled."""
    with program(tmp_path, "--register", env=DECLARED) as (proc, _log):
        got = pyspy.fallback(proc.pid, DECLARED, timeout=30)
        assert got.status == "ok" and got.method == "faulthandler", got.detail
    with program(tmp_path, env={}) as (proc, _log):
        got = pyspy.fallback(proc.pid, {}, timeout=5)
    assert got.status == "unavailable"
    v = sys.version_info
    assert f"needs Python 3.15+ (this process: {v.major}.{v.minor})" in got.detail
    assert "not set" in got.detail
    sleeper = subprocess.Popen(["sleep", "30"], env={**os.environ, **DECLARED})
    try:
        got = pyspy.fallback(sleeper.pid, DECLARED, timeout=5)
        assert got.status == "unavailable" and got.detail == "not a Python process"
    finally:
        sleeper.kill()
        sleeper.wait()


# The format of CPython 3.15's Lib/profiling/sampling/dump.py (format_stack_dump, no colour):
# this machine has no 3.15 to run it, so the parser is checked on text in that format.
SAMPLING_DUMP = """\
Stack dump for PID 4242, thread 4242 (main thread; idle; most recent call last):
  File "/job/train.py", line 40, in <module>
    main()
  File "/job/train.py", line 31, in main
    dist.all_reduce(t)
  File "/usr/lib/python3.15/site-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce
    work.wait()

Stack dump, thread 4250 (has GIL; on CPU; most recent call last):
  File "/usr/lib/python3.15/threading.py", line 1012, in Thread._bootstrap
  File "/job/train.py", line 12, in Loader.run  opcode=CALL
"""


def test_sampling_dump_format_parsed() -> None:
    threads = pyspy.parse_sampling_dump(SAMPLING_DUMP, 4242)
    assert len(threads) == 2
    main, other = threads
    assert main["os_thread_id"] == 4242 and main["thread_name"] == "MainThread"
    assert not main["active"] and other["active"] and other["owns_gil"]
    assert [f["name"] for f in main["frames"]] == ["all_reduce", "main", "<module>"]
    assert main["frames"][0]["short_filename"] == "torch/distributed/distributed_c10d.py"
    assert [f["name"] for f in other["frames"]] == ["Loader.run", "Thread._bootstrap"]
    assert pyspy.sampling_argv("/usr/bin/python3.15", 4242)[1:] == [
        "-m", "profiling.sampling", "dump", "-a", "4242"]


def test_faulthandler_text_with_foreign_lines_and_two_dumps() -> None:
    text = ("step=1\n"
            "Current thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/a/t.py", line 3 in old\n'
            "Current thread 0x00007f0000000001 (most recent call first):\n"
            "step=2 rank=1\n"
            '  File "/a/t.py", line 8 in inner\n'
            '  File "/a/t.py", line ??? in <module>\n')
    threads = faulthandler.parse(text, 7)
    assert len(threads) == 1
    assert [(f["name"], f["line"]) for f in threads[0]["frames"]] == [("inner", 8),
                                                                       ("<module>", None)]
    assert faulthandler.parse_signal("10") == signal.SIGUSR1
    assert faulthandler.parse_signal("USR2") == signal.SIGUSR2


# -- a real hung job: collect with py-spy unusable, then analyze --------------------------------
@pytest.mark.scenario
def test_collect_hung_torchrun_job_with_faulthandler_fallback(tmp_path: Path) -> None:
    from scenarios.runner import SCRUBBED_ENV, TAG_ENV, free_port, stop_job

    job_py = Path(__file__).resolve().parent / "watch_jobs" / "job.py"
    port = str(free_port())
    tag = f"fallback-{os.getpid()}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update({TAG_ENV: tag, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **DECLARED})
    console = tmp_path / "console.log"
    started: list[subprocess.Popen[bytes]] = []
    try:
        with open(console, "wb") as fh:
            job = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                 "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port,
                 str(job_py), "dataloader", "--faulthandler"],
                env=env, stdout=fh, stderr=subprocess.STDOUT)
        started.append(job)
        end = time.monotonic() + 150
        while "HANG_START" not in console.read_text(errors="replace"):
            assert job.poll() is None and time.monotonic() < end, console.read_text()
            time.sleep(0.2)
        time.sleep(1.0)  # rank 0 reaches its all_reduce
        tool_env = {**env, pyspy.PYSPY_ENV: "/bin/false"}  # a py-spy that fails
        tool_env.pop(faulthandler.ENV_VAR)  # declared by the job alone
        bundle = tmp_path / "bundle"
        done = subprocess.run([sys.executable, "-m", "ddp_autopsy", "collect", "--pid",
                               str(job.pid), "--out", str(bundle)], env=tool_env,
                              capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode()
        assert job.poll() is None, "the job did not survive the collection"
    finally:
        stop_job(started, tag)
    manifest = json.loads((bundle / "manifest.json").read_text())
    workers = [p for p in manifest["processes"] if p["role"] == "worker"]
    assert sorted(p["rank"] for p in workers) == [0, 1]
    assert {p["stack_status"] for p in workers} == {"ok"}
    assert {p["stack_source"] for p in workers} == {"faulthandler"}
    assert any(p["kind"] == "stack_fallback" for p in manifest["problems"])
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "ddp_autopsy", "analyze", str(bundle), "--format", "json"],
        capture_output=True, timeout=120, check=False).stdout)
    v = report["verdict"]
    assert v["cause"] == "rank_stuck_outside_collective" and v["ranks"] == [1], v
    assert "__getitem__" in v["summary"]
    assert report["stacks"]["processes"] == 2
    said = [f for f in report["findings"] if f["rule"] == "AUT003"]
    assert said and "faulthandler" in said[0]["summary"], report["findings"]
