"""``ddp-autopsy watch`` / ``run`` (issue #14).

The detector's logic on recorded observations, the snapshot reader, then real Gloo jobs on CPU
(``tests/watch_jobs/job.py``) under ``torchrun`` and ``mp.spawn``, watched by the real CLI: a hang
in a data loader, a barrier on rank 0 only, a deadlock between two process groups, a crashing
rank, and a healthy job with quiet phases that must not trigger. Every wait is on an event (the
watcher's exit, a line in a file); bounds are generous. Every process a test starts carries a
tag in its environment and is stopped by it, even when the test fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scenarios.runner import SCRUBBED_ENV, TAG_ENV, free_port, stop_job

from ddp_autopsy.analyzer import snapshots
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.analyzer.sources import iter_inputs
from ddp_autopsy.rules.engine import run
from ddp_autopsy.watch.detector import Detector
from ddp_autopsy.watch.probe import Sample, Usage

JOB = Path(__file__).resolve().parent / "watch_jobs" / "job.py"
HANG_AFTER = 6.0
BUDGET_S = HANG_AFTER + 15  # detected and collected within --hang-after + 15 s
WATCH_TIMEOUT_S = 150  # the whole watched job, start-up included, on a loaded machine


# -- the detector on recorded observations -------------------------------------------------
def _sample(pid: int, sig: str, where: str = "all_reduce", coll: bool = True) -> Sample:
    return Sample(pid, "ok", sig, where, coll)


def _feed(det: Detector, t: float, sigs: dict[int, str], cpu: dict[int, float]) -> None:
    for pid, c in cpu.items():
        det.usage(t, pid, Usage(c, 0, "S"))
    if det.sample_due(t):
        det.stacks(t, {pid: _sample(pid, s) for pid, s in sigs.items()})


def test_stuck_ranks_declared_after_hang_after_not_before() -> None:
    det = Detector(10.0, now=0.0)
    for pid in (1, 2):
        det.track(pid, f"rank {pid - 1}")
    states = {}
    for t in range(0, 16):
        _feed(det, float(t), {1: "a", 2: "b"}, {1: 0.01 * t, 2: 0.01 * t})
        states[t] = det.status(float(t)).state
    assert "hung" not in [states[t] for t in range(10)]
    assert "hung" in states.values()
    first = min(t for t, s in states.items() if s == "hung")
    assert 10 <= first <= 12
    # declared once, until progress re-arms it
    assert list(states.values()).count("hung") == 1


def test_slow_rank_whose_stack_moves_is_not_a_hang() -> None:
    det = Detector(6.0, now=0.0)
    det.track(1, "rank 0")
    det.track(2, "rank 1")
    for t in range(0, 40):
        _feed(det, float(t), {1: f"step{t}", 2: "wait"}, {1: 0.9 * t, 2: 0.0})
        assert det.status(float(t)).state != "hung", t


def test_log_growth_is_progress() -> None:
    det = Detector(6.0, now=0.0)
    det.track(1, "rank 0")
    for t in range(0, 30):
        det.logs(float(t), 100 if t % 5 == 0 else 0)
        _feed(det, float(t), {1: "same"}, {1: 0.0})
        assert det.status(float(t)).state != "hung", t


def test_busy_rank_while_others_wait_is_named_then_stuck() -> None:
    """Rank 0 burns CPU in one frame while rank 1 waits: named at hang_after/2, and a hang at
    hang_after (its stack never moves: stuck, not slow)."""
    det = Detector(10.0, now=0.0)
    det.track(1, "rank 0")
    det.track(2, "rank 1")
    notices, hung = [], []
    for t in range(0, 16):
        for_cpu = {1: 1.0 * t, 2: 0.0}
        for pid, c in for_cpu.items():
            det.usage(float(t), pid, Usage(c, 0, "R" if pid == 1 else "S"))
        if det.sample_due(float(t)):
            det.stacks(float(t), {1: _sample(1, "spin", "evaluate (train.py:9)", False),
                                  2: _sample(2, "wait", "all_reduce (c10d.py:1)")})
        st = det.status(float(t))
        if st.busy_notice:
            notices.append((t, st.busy_notice))
        if st.state == "hung":
            hung.append(t)
    assert len(notices) == 1
    t, notice = notices[0]
    assert 5 <= t < 10
    assert notice.startswith("rank 0 busy") and "evaluate (train.py:9)" in notice
    assert "rank 1 waits in all_reduce" in notice
    assert hung and hung[0] >= 10


def test_every_rank_busy_in_one_frame_is_not_a_hang() -> None:
    """A long compile or matmul on every rank: same stack, no logs, but nobody waits."""
    det = Detector(5.0, now=0.0)
    det.track(1, "rank 0")
    det.track(2, "rank 1")
    for t in range(0, 30):
        _feed(det, float(t), {1: "mm", 2: "mm"}, {1: 1.0 * t, 2: 1.0 * t})
        assert det.status(float(t)).state != "hung"


def test_without_stacks_falls_back_and_says_so() -> None:
    det = Detector(5.0, now=0.0)
    det.track(1, "rank 0")
    seen = []
    for t in range(0, 12):
        det.usage(float(t), 1, Usage(0.0, 0, "S"))
        if det.sample_due(float(t)):
            det.stacks(float(t), {1: Sample(1, "not_python", error="unsupported version",
                                            python="3.14")})
        st = det.status(float(t))
        seen.append((st.fallback, st.state))
    fallbacks = [f for f, _ in seen if f]
    assert len(fallbacks) == 1 and "Python 3.14" in fallbacks[0]
    assert "log growth and CPU time only" in fallbacks[0]
    assert "hung" in [s for _, s in seen]


def test_rank_starved_of_cpu_is_not_waiting() -> None:
    """A loaded host: rank 1 is runnable (state R) but gets 10 % of a core and py-spy cannot
    read it; rank 0 waits in one stack. Nobody may call that a hang: rank 1 is not waiting.
    Once rank 1 sleeps (state S) like a hung rank, the same observations are a hang."""
    for state, hang in (("R", False), ("S", True)):
        det = Detector(6.0, now=0.0)
        det.track(1, "rank 0")
        det.track(2, "rank 1")
        states = []
        for t in range(0, 20):
            det.usage(float(t), 1, Usage(0.0, 0, "S"))
            det.usage(float(t), 2, Usage(0.1 * t, 0, state))
            if det.sample_due(float(t)):
                det.stacks(float(t), {1: _sample(1, "wait"),
                                      2: Sample(2, "timeout", error="py-spy timed out")})
            states.append(det.status(float(t)).state)
        assert ("hung" in states) is hang, (state, states)


def test_log_tail_skips_the_watchers_own_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    """One key per file however it is named; bytes a faulthandler dump added are skipped, the
    job's own bytes before them still reported."""
    from ddp_autopsy.watch.probe import LogTail

    log = tmp_path / "console.log"
    log.write_text("start\n")
    monkeypatch.chdir(tmp_path)
    tail = LogTail()
    tail.add("console.log")
    tail.add(str(log))
    assert list(tail.sizes) == [str(log.resolve())]
    with open(log, "a") as fh:
        fh.write("step=1\n")  # the job, before the signal
        start = fh.tell()
        fh.write('Current thread 0x1 (most recent call first):\n  File "t.py", line 1 in f\n')
        end = fh.tell()
    assert tail.skip(str(log), start, end) == len("step=1\n")
    assert tail.poll() == (0, [])
    assert tail.skip(str(tmp_path / "other.log"), 0, 10) is None


def test_sampling_is_adaptive() -> None:
    """No py-spy while the logs grow; every fast period once quiet; slower while stacks move."""
    det = Detector(80.0, now=0.0)  # fast period 10 s, slow up to 26.7 s
    det.track(1, "rank 0")
    due = [t for t in range(0, 60) if det.logs(float(t), 10) is None and det.sample_due(t)]
    assert due == []
    times = []
    for t in range(60, 260):
        if det.sample_due(float(t)):
            times.append(t)
            det.stacks(float(t), {1: _sample(1, f"moving{t}")})
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] == 10 and max(gaps) > 20


# -- snapshots ------------------------------------------------------------------------------
def _dump(pid: int, frames: list[tuple[str, str, int]]) -> bytes:
    return json.dumps([{"pid": pid, "thread_id": 1, "thread_name": "MainThread",
                        "os_thread_id": pid, "active": False, "owns_gil": False,
                        "frames": [{"name": n, "filename": f, "line": ln,
                                    "short_filename": f} for n, f, ln in frames]}]).encode()


def test_movement_between_snapshots() -> None:
    wait = [("all_reduce", "torch/distributed/distributed_c10d.py", 3252), ("train", "t.py", 9)]
    snaps = []
    for i in range(3):
        snap = snapshots.Snapshot(None)
        snap.points[10] = snapshots.point(_dump(10, wait), 10, 0)
        snap.points[11] = snapshots.point(_dump(11, [("step", "t.py", 4), ("train", "t.py", 20 + i)]),
                                          11, 1)
        snaps.append(snap)
    moves = snapshots.movement(snaps)
    assert [(m.rank, m.moved, m.snapshots) for m in moves] == [(0, False, 3), (1, True, 3)]
    assert snapshots.summary(moves) == "moved: rank 1; did not move: rank 0 (3 snapshots)"
    assert moves[1].describe() == "rank 1 moved: step (t.py:4) < train (t.py:20) -> " \
                                  "step (t.py:4) < train (t.py:22)"


# -- real jobs ------------------------------------------------------------------------------
@contextlib.contextmanager
def tagged_env() -> Iterator[tuple[dict[str, str], list[subprocess.Popen[bytes]], str]]:
    """An environment that tags every process started with it; all of them are stopped at the
    end (SIGTERM, then SIGKILL), whatever the test did."""
    tag = f"watch-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update({TAG_ENV: tag, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield env, started, tag
    finally:
        stop_job(started, tag)


def torchrun(env: dict[str, str], *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
            "2", "--master-addr", "127.0.0.1", "--master-port", env["MASTER_PORT"], str(JOB),
            *args]


def spawn(*args: str) -> list[str]:
    return [sys.executable, str(JOB), *args, "--spawn", "2"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_autopsy", *args]


def watch_run(tmp_path: Path, env: dict[str, str], started: list[subprocess.Popen[bytes]],
              job: list[str], *opts: str) -> tuple[int, list[dict[str, Any]], Path]:
    """``ddp-autopsy run [opts] -- job``; returns (exit code, events, out dir)."""
    out = tmp_path / "watch"
    argv = cli("run", "--out", str(out), *opts, "--", *job)
    with open(tmp_path / "watch.err", "wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        started.append(proc)
        try:
            code = proc.wait(timeout=WATCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the watcher did not finish:\n" + _tail(tmp_path / "watch.err"))
    return code, events(out), out


def events(out: Path) -> list[dict[str, Any]]:
    path = out / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def hang_start(console: Path) -> float:
    """When the job entered its failure: the latest ``HANG_START`` of any rank."""
    times = [float(line.rsplit("t=", 1)[1]) for line in console.read_text().splitlines()
             if line.startswith("HANG_START")]
    assert times, "the job never reached its failure"
    return max(times)


def one(evs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [e for e in evs if e["event"] == kind]
    assert len(found) == 1, f"{kind}: {found}\n{[e['event'] for e in evs]}"
    return found[0]


def check_hang(out: Path, evs: list[dict[str, Any]], console: Path) -> dict[str, Any]:
    """Detected and collected within the budget, with snapshots in the bundle; the verdict."""
    start = hang_start(console)
    hang, collected, verdict = one(evs, "hang"), one(evs, "collected"), one(evs, "verdict")
    assert hang["t"] - start >= HANG_AFTER - 1, "declared before --hang-after"
    assert collected["t"] - start <= BUDGET_S, f"collected {collected['t'] - start:.1f}s " \
                                               "after the hang"
    bundle = Path(collected["bundle"])
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["watch"]["event"] == "hang"
    assert len(manifest["snapshots"]) >= 2
    # the bundle is what collect writes, readable by analyze, and the ranks did not move
    report = json.loads(Path(verdict["report"]).read_text())
    assert report["verdict"] is not None
    assert sorted(verdict["still"]) == [0, 1] and verdict["moved"] == []
    return verdict


@pytest.mark.scenario
def test_run_torchrun_dataloader_hang(tmp_path: Path) -> None:
    with tagged_env() as (env, started, _tag):
        _code, evs, out = watch_run(tmp_path, env, started, torchrun(env, "dataloader"),
                                   "--hang-after", str(HANG_AFTER), "--once",
                                   "--kill-after", "0")
        verdict = check_hang(out, evs, out / "console.log")
        assert verdict["cause"] == "rank_stuck_outside_collective", verdict
        assert verdict["ranks"] == [1]
        assert "__getitem__" in verdict["summary"]
        hang = one(evs, "hang")
        assert "__getitem__" in hang["where"]["rank 1"]
        assert "all_reduce" in hang["where"]["rank 0"]
        check_merge_repeated(Path(one(evs, "collected")["bundle"]), tmp_path)
        # --kill-after 0: the launcher got SIGTERM and the job is gone
        assert one(evs, "kill")
        ended = one(evs, "ended")
        assert ended["killed"] is True


@pytest.mark.scenario
def test_run_spawn_dataloader_hang_stacks_from_faulthandler(tmp_path: Path) -> None:
    """py-spy fails (``DDP_AUTOPSY_PYSPY`` names a program that fails); the job registered
    faulthandler on SIGUSR1 and declares it. The samples and the bundle's stacks come from
    faulthandler: detected within the budget, the same verdict as with py-spy, and the dumps the
    watcher caused in the job's log are not taken for progress."""
    with tagged_env() as (env, started, _tag):
        env.update({"DDP_AUTOPSY_PYSPY": "/bin/false", "DDP_AUTOPSY_FAULTHANDLER": "SIGUSR1"})
        _code, evs, out = watch_run(tmp_path, env, started,
                                    spawn("dataloader", "--faulthandler"),
                                    "--hang-after", str(HANG_AFTER), "--once",
                                    "--kill-after", "0")
        verdict = check_hang(out, evs, out / "console.log")
        assert verdict["cause"] == "rank_stuck_outside_collective", verdict
        assert verdict["ranks"] == [1]
        fallback = one(evs, "fallback")
        assert fallback["source"] == "faulthandler" and "SIGUSR1" in fallback["message"]
        assert "__getitem__" in one(evs, "hang")["where"]["rank 1"]
        # the samples really were faulthandler dumps in the job's own log
        assert (out / "console.log").read_text().count("(most recent call first):") >= 6
        report = json.loads(Path(verdict["report"]).read_text())
        said = [f for f in report["findings"] if f["rule"] == "AUT003"]
        assert said and "faulthandler" in said[0]["summary"], report["findings"]
        assert report["stacks"]["processes"] >= 2


@pytest.mark.scenario
def test_watch_pid_spawn_barrier_on_rank0_only(tmp_path: Path) -> None:
    """``watch --pid`` attached to an mp.spawn job that was started without it."""
    with tagged_env() as (env, started, _tag):
        console = tmp_path / "console.log"
        with open(console, "wb") as fh:
            job = subprocess.Popen(spawn("barrier0"), env=env, stdout=fh,
                                   stderr=subprocess.STDOUT)
        started.append(job)
        _wait_for_line(console, "step=0", job)
        out = tmp_path / "watch"
        hook_file = tmp_path / "hook.txt"
        argv = cli("watch", "--pid", str(job.pid), "--out", str(out), "--hang-after",
                   str(HANG_AFTER), "--once", "--kill-after", "0", "--logs", str(console),
                   "--on-hang", f'echo "$DDP_AUTOPSY_BUNDLE" > {hook_file}')
        with open(tmp_path / "watch.err", "wb") as err:
            watcher = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
            started.append(watcher)
            code = watcher.wait(timeout=WATCH_TIMEOUT_S)
        evs = events(out)
        assert code == 1, _tail(tmp_path / "watch.err")
        verdict = check_hang(out, evs, console)
        assert verdict["cause"] == "collective_mismatch", verdict
        assert "barrier" in verdict["summary"] and "rank 0" in verdict["summary"].lower()
        assert hook_file.read_text().strip() == one(evs, "collected")["bundle"]
        assert job.wait(timeout=30) is not None  # ended by --kill-after


@pytest.mark.scenario
def test_run_torchrun_collective_deadlock_with_two_watchers(tmp_path: Path) -> None:
    """Two process groups taken in opposite order. A second watcher (``--node b``, a hang-after
    it never reaches) meets the first through --shared-dir and collects when it triggers."""
    shared = tmp_path / "shared"
    with tagged_env() as (env, started, _tag):
        out = tmp_path / "watch"
        argv = cli("run", "--out", str(out), "--hang-after", str(HANG_AFTER), "--once",
                   "--kill-after", "2", "--shared-dir", str(shared), "--node", "a", "--",
                   *torchrun(env, "deadlock"))
        with open(tmp_path / "a.err", "wb") as err:
            a = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
            started.append(a)
        _wait_for_line(out / "console.log", "step=0", a)
        launcher = one(_wait_for_event(out, "start", a), "start")["launcher_pid"]
        with open(tmp_path / "b.err", "wb") as err:
            b = subprocess.Popen(cli("watch", "--pid", str(launcher), "--out",
                                     str(tmp_path / "b"), "--hang-after", "600",
                                     "--shared-dir", str(shared), "--node", "b"),
                                 env=env, stdout=subprocess.DEVNULL, stderr=err)
            started.append(b)
        _wait_for_event(tmp_path / "b", "start", b)
        a.wait(timeout=WATCH_TIMEOUT_S)
        b.wait(timeout=60)  # the job ended (killed by a): b makes its post-mortem and exits
        evs = events(out)
        verdict = check_hang(out, evs, out / "console.log")
        assert verdict["cause"] == "collective_mismatch", verdict
        assert "all_reduce" in verdict["summary"]
        tid = one(evs, "trigger")["trigger"]
        remote = one(events(tmp_path / "b"), "remote_trigger")
        assert remote["trigger"] == tid and remote["node"] == "a"
        assert (shared / tid / "a" / "manifest.json").is_file()
        assert json.loads((shared / tid / "b" / "manifest.json").read_text())["watch"][
            "from"] == "a"
        # a analyzed both nodes' bundles of the same processes as one job: merged, no
        # "2 processes claim rank 0"
        report = json.loads(Path(verdict["report"]).read_text())
        assert not [f for f in report["findings"] if "claim rank" in f["summary"]], report


@pytest.mark.scenario
def test_run_torchrun_crashing_rank(tmp_path: Path) -> None:
    """The post-mortem: logs kept, exit codes, the verdict, and an upload to a real
    ``ddp-autopsy serve``."""
    try:  # the server extra (httpx, FastAPI) may be missing: then no upload
        import server_helpers
    except ImportError:
        server_helpers = None
    server = server_helpers.Server(tmp_path / "server").start() if server_helpers else None
    upload = ["--upload", server.url, "--upload-token", server_helpers.TOKEN] if server else []
    try:
        with tagged_env() as (env, started, _tag):
            code, evs, out = watch_run(tmp_path, env, started, torchrun(env, "crash"),
                                       "--hang-after", str(HANG_AFTER), *upload)
        assert code == 1  # the job's own exit code
        ended = one(evs, "ended")
        assert ended["exit_code"] == 1 and not ended["killed"]
        assert one(evs, "postmortem")["logs"] >= 1
        assert json.loads((out / "postmortem" / "exit_codes.json").read_text())["launcher"] == 1
        verdict = one(evs, "verdict")
        assert verdict["cause"] == "rank_crashed" and verdict["ranks"] == [1], verdict
        assert "illegal memory access" in verdict["summary"]
        assert not [e for e in evs if e["event"] == "hang"]
        if server is not None:
            uploaded = one(evs, "uploaded")
            assert uploaded["url"].startswith(server.url) and uploaded["incident"]
            server.wait_analysed(uploaded["incident"])
    finally:
        if server is not None:
            server.stop()


@pytest.mark.scenario
def test_run_spawn_healthy_quiet_phases_not_triggered(tmp_path: Path) -> None:
    """Every rank evaluates (sleeps, prints nothing) for 7 s, twice, with --hang-after 12: the
    watcher samples the quiet phase (it is looking) but declares nothing; exit code 0."""
    with tagged_env() as (env, started, _tag):
        code, evs, _out = watch_run(tmp_path, env, started, spawn("quiet", "--quiet-s", "7"),
                                    "--hang-after", "12")
        assert code == 0, _tail(tmp_path / "watch.err")
        kinds = [e["event"] for e in evs]
        assert "hang" not in kinds and "collected" not in kinds and "busy" not in kinds
        quiet = [e for e in evs if e["event"] == "sample"
                 and all("evaluate" in str(w) for w in e["where"].values())]
        assert len(quiet) >= 2, kinds
        assert one(evs, "ended")["exit_code"] == 0


# Every failure under both launchers. The dedicated tests above cover torchrun-dataloader,
# spawn-dataloader (faulthandler), spawn-barrier0 and torchrun-deadlock; the default run adds the
# two missing cells, DDP_AUTOPSY_WATCH_MATRIX=1 runs all six (long: about a minute each).
MATRIX = [(launcher, mode) for mode in ("dataloader", "barrier0", "deadlock")
          for launcher in ("torchrun", "spawn")]
SAMPLE = {("torchrun", "barrier0"), ("spawn", "deadlock")}
EXPECTED = {"dataloader": ("rank_stuck_outside_collective", "__getitem__"),
            "barrier0": ("collective_mismatch", "barrier"),
            "deadlock": ("collective_mismatch", "all_reduce")}


@pytest.mark.scenario
@pytest.mark.parametrize(("launcher", "mode"), [
    pytest.param(*cell, marks=() if cell in SAMPLE or os.environ.get("DDP_AUTOPSY_WATCH_MATRIX")
                 else pytest.mark.skip(reason="covered by a dedicated test; "
                                              "DDP_AUTOPSY_WATCH_MATRIX=1 runs it"))
    for cell in MATRIX], ids=[f"{a}-{b}" for a, b in MATRIX])
def test_hang_matrix(tmp_path: Path, launcher: str, mode: str) -> None:
    """``run`` over each failure under each launcher: detected and collected within the
    budget, the verdict right."""
    with tagged_env() as (env, started, _tag):
        job = torchrun(env, mode) if launcher == "torchrun" else spawn(mode)
        _code, evs, out = watch_run(tmp_path, env, started, job, "--hang-after",
                                    str(HANG_AFTER), "--once", "--kill-after", "0")
        verdict = check_hang(out, evs, out / "console.log")
        cause, needle = EXPECTED[mode]
        assert verdict["cause"] == cause and needle in verdict["summary"], verdict
        if mode == "dataloader":
            assert verdict["ranks"] == [1]


def check_merge_repeated(bundle: Path, tmp_path: Path) -> None:
    """Two bundles of the same processes (the hang's bundle, and a copy of it collected
    "later") analyze as one set of processes, the newer bundle's, and the movement between them
    is reported; the watch snapshots of one bundle are read back."""
    first, second = tmp_path / "b1", tmp_path / "b2"
    shutil.copytree(bundle, first)
    shutil.copytree(bundle, second)
    man = json.loads((second / "manifest.json").read_text())
    man["created"] = "2099-01-01T00:00:00+00:00"
    (second / "manifest.json").write_text(json.dumps(man))
    single = load([first])
    job = load([first, second])  # load folds bundles of the same processes (merge_repeated)
    moves = job.snapshot_moves
    assert job.processes.height == single.processes.height
    assert set(job.processes["bundle"].to_list()) == {str(second)}
    assert job.stacks.height == single.stacks.height
    assert not [f for f in run(job).findings if "claim rank" in f.summary]
    workers = [m for m in moves if m.rank is not None]
    assert sorted(m.rank for m in workers) == [0, 1] and not any(m.moved for m in workers)
    for _p, tree in iter_inputs([bundle], []):
        read = snapshots.read_tree(tree, man)
        assert len(read) == len(man["snapshots"]) + 1
        assert not any(m.moved for m in snapshots.movement(read))


def _wait_for_line(path: Path, needle: str, proc: subprocess.Popen[bytes],
                   timeout: float = WATCH_TIMEOUT_S) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {needle!r}:\n{_tail(path)}")
        time.sleep(0.2)
    pytest.fail(f"{needle!r} never appeared in {path}")


def _wait_for_event(out: Path, kind: str, proc: subprocess.Popen[bytes],
                    timeout: float = WATCH_TIMEOUT_S) -> list[dict[str, Any]]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        evs = events(out)
        if any(e["event"] == kind for e in evs):
            return evs
        if proc.poll() is not None:
            pytest.fail(f"the watcher exited ({proc.returncode}) before {kind!r}")
        time.sleep(0.2)
    pytest.fail(f"no {kind!r} event in {out}")
