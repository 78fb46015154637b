"""Many large plain files are read, sifted and classified in forked worker processes
(``events.Presifter``, ``workers.ForkPool``): the events, notes and inputs must be exactly those
of reading them in this process, for every log of the rule cases and a fixed sample of the
corpus (``test_perf_quick.equivalence_cases``), and the large files of ``test_perf_quick``; a
worker killed by a signal mid-read, or one that hangs, leaves a note and loses no event."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from ddp_autopsy.analyzer import events, job, workers

try:
    from tests.test_perf_quick import _inputs
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_perf_quick import _inputs  # type: ignore[no-redef]

pytestmark = pytest.mark.skipif(
    events._hyperscan() is None or not workers.available() or workers.cores() < 2,
    reason="worker processes need Linux, two cores and Hyperscan")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _inputs(tmp_path_factory.mktemp("workers"))


def _load(path: Path, monkeypatch: pytest.MonkeyPatch, *, forked: bool,
          hook: object = None, fallback: bool = False) -> tuple[job.Job, int]:
    """``path`` loaded with every file presifted and sifted without polars where it can be
    (any size), in worker processes or not (``fallback``: stopped when most files come back,
    as in use; else never, so that every file is offered to them); and how many files the
    workers classified."""
    done = 0
    take = events.Presifter._take_forked

    def counting(self: events.Presifter, key: object, index: int) -> events.Sifted | None:
        nonlocal done
        got = take(self, key, index)
        done += got is not None
        return got

    with monkeypatch.context() as m:
        m.setattr(events, "HYPERSCAN_MIN", 0)
        m.setattr(events, "QUICK_MIN", 0)
        m.setattr(job, "PRESIFT_FILES", 2)
        m.setattr(events, "PROCESS_FILES", 1 if forked else 10**9)
        m.setattr(events, "_child_hook", hook)
        if not fallback:
            m.setattr(events, "FALLBACK_AFTER", 10**9)
        m.setattr(events.Presifter, "_take_forked", counting)
        return job.load([path]), done


def _same(a: job.Job, b: job.Job, skip_notes: int = 0) -> None:
    assert_frame_equal(a.events, b.events)
    assert [n.to_dict() for n in a.notes] == [n.to_dict() for n in b.notes[skip_notes:]]
    assert [r.to_dict() for r in a.inputs] == [r.to_dict() for r in b.inputs]


def test_workers_give_what_this_process_gives(inputs: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    here, none = _load(inputs, monkeypatch, forked=False)
    there, done = _load(inputs, monkeypatch, forked=True)
    assert none == 0 and done > 50 and here.events.height > 500
    _same(here, there)


def test_the_workers_prefix_probe_misses_no_prefix(inputs: Path) -> None:
    """Workers look for prefixes among a file's first lines by Hyperscan (polars' probe cannot
    run in them): it says no only where polars' does, on every log and on made heads."""
    made = [b"[rank3]: x\n", b"  17: x\n", b"2024-05-01 10:11:12 [rank0]: x\n", b"E\n",
            b"node1: x\n", b"web-1  | x\n", b"(pid=42) x\n", b"[1,0]<stdout>: x\n"]
    blocks = [f.read_bytes() for f in sorted(inputs.rglob("*")) if f.is_file()]
    blocks += [b"Epoch 1 starting\n" * n + head + b"done\n" for head in made
               for n in (0, 5, events.SAMPLE_LINES - 1, events.SAMPLE_LINES)]
    said = {True: 0, False: 0}
    for block in blocks:
        if not block.isascii() or b"\r" in block:
            continue
        block = block if block.endswith(b"\n") else block + b"\n"
        polars = events._probe_head(block)
        said[polars] += 1
        if polars:
            assert events._prefixed_head(block), block[:200]
    assert said[True] > 100 and said[False] > 100
    assert not events._prefixed_head(b"Epoch 1 starting\n" * events.SAMPLE_LINES + b"[rank3]: x\n")


def _once(marker: Path, then: object) -> object:
    """A child hook that runs ``then(n)`` in the first worker to reach its fourth file only
    (an exclusive create decides which)."""

    def hook(n: int) -> None:
        if n == 3:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            then(n)  # type: ignore[operator]

    return hook


def test_a_worker_killed_mid_read_loses_nothing(inputs: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    here, _ = _load(inputs, monkeypatch, forked=False)
    kill = _once(tmp_path / "killed", lambda _n: os.kill(os.getpid(), signal.SIGKILL))
    there, done = _load(inputs, monkeypatch, forked=True, hook=kill)
    assert (tmp_path / "killed").exists() and done > 40  # the other worker went on
    died = [n for n in there.notes if "worker process ended (signal SIGKILL)" in n.message]
    assert len(died) == 1 and died[0].level == "warning"
    there.notes.remove(died[0])
    _same(here, there)


def test_a_hung_worker_is_stopped(inputs: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    here, _ = _load(inputs, monkeypatch, forked=False)
    monkeypatch.setattr(workers, "HANG_SECONDS", 1.0)
    hang = _once(tmp_path / "hung", lambda _n: time.sleep(3600))
    t0 = time.monotonic()
    there, _ = _load(inputs, monkeypatch, forked=True, hook=hang)
    assert time.monotonic() - t0 < 60
    hung = [n for n in there.notes if "sent nothing for 1 s" in n.message]
    assert len(hung) == 1
    there.notes.remove(hung[0])
    _same(here, there)


CHILD = """
import os, sys, time
from ddp_autopsy.analyzer import events, job
events.HYPERSCAN_MIN = events.QUICK_MIN = 0
events.PROCESS_FILES, job.PRESIFT_FILES = 1, 2
def hook(n):
    open(os.path.join(sys.argv[2], str(os.getpid())), "w").close()
    time.sleep(120)
events._child_hook = hook
job.load([sys.argv[1]])
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_workers_end_with_their_parent(tmp_path: Path) -> None:
    """A parent killed (SIGKILL: no clean-up of its own) takes its workers with it."""
    import subprocess
    import sys

    logs, pids = tmp_path / "logs", tmp_path / "pids"
    logs.mkdir()
    pids.mkdir()
    for i in range(24):  # three chunks: two workers
        (logs / f"rank{i}.log").write_text(f"NCCL INFO rank {i} line\n" * 50)
    parent = subprocess.Popen([sys.executable, "-c", CHILD, str(logs), str(pids)])
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        children = [int(p.name) for p in pids.iterdir()]
        assert len(children) == 2
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while not all(map(_gone, children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(map(_gone, children))


def test_prefixed_files_go_back_to_the_threads(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Files whose heads carry prefixes need polars: workers hand them back, and once most of
    the first ones came back the workers are stopped and the rest read on the threads; the
    events are those of reading them without workers."""
    for i in range(40):
        (tmp_path / f"rank{i}.log").write_text(
            f"[rank{i}]: starting\n" + f"NCCL INFO rank {i} line\n" * 200
            + f"[rank{i}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    fell = []
    fall_back = events.Presifter._fall_back
    monkeypatch.setattr(events.Presifter, "_fall_back",
                        lambda self, index: (fell.append(index), fall_back(self, index)))
    here, _ = _load(tmp_path, monkeypatch, forked=False)
    there, done = _load(tmp_path, monkeypatch, forked=True, fallback=True)
    assert done == 0 and fell == [events.FALLBACK_AFTER - 1]
    assert here.events.filter(here.events["kind"] == "oom").height == 40
    _same(here, there)


def test_a_prefix_regex_hyperscan_cannot_compile_only_turns_workers_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(events, "ANY_PREFIX", r"^(a)\1: ")  # a back-reference: not for Hyperscan
    for name in ("_hs", "_hs_db", "_hs_maybe", "_hs_prefix"):
        monkeypatch.setattr(events, name, None)
    assert events._hyperscan() is not None and events._hs_prefix is None
    assert not events._processes() and not (tmp_path / "ddp-autopsy").exists()


def _children() -> set[int]:
    """This process's children, zombies included (not yet reaped)."""
    out: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:  # (a thread may end meanwhile)
            out.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return out


def test_meanwhile_runs_once_while_the_workers_read(inputs: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``load(meanwhile=)``: called once, in this process, while its workers are alive (what
    ``analyze`` does with the rules' import); the events are those of a load without it."""
    before = _children()
    seen: list[set[int]] = []
    here, _ = _load(inputs, monkeypatch, forked=True)
    with monkeypatch.context() as m:
        m.setattr(job, "load", functools.partial(job.load, meanwhile=lambda: seen.append(
            _children() - before)))
        there, done = _load(inputs, monkeypatch, forked=True)
    assert len(seen) == 1 and len(seen[0]) == workers.cores() and done > 40
    _same(here, there)
    assert _children() == before


def test_meanwhile_raising_stops_the_workers(inputs: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    before = _children()

    def fail() -> None:
        assert len(_children() - before) == workers.cores()
        raise KeyboardInterrupt  # (anything: a configuration error, Ctrl-C)

    with monkeypatch.context() as m:
        m.setattr(job, "load", functools.partial(job.load, meanwhile=fail))
        with pytest.raises(KeyboardInterrupt):
            _load(inputs, monkeypatch, forked=True)
    assert _children() == before  # killed and reaped: no orphan, no zombie


def test_meanwhile_without_workers_runs_after_reading(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("RuntimeError: boom\n")
    calls: list[int] = []
    got = job.load([tmp_path], meanwhile=lambda: calls.append(len(calls)))
    assert calls == [0] and got.events.height


def test_a_bad_configuration_with_workers_reading(tmp_path: Path) -> None:
    """``analyze`` of a tree its workers read, with a configuration it cannot use: exit 2, the
    message and nothing else, no process left behind."""
    import subprocess
    import sys

    logs = tmp_path / "logs"
    logs.mkdir()
    line = b"host1:123:456 [0] NCCL INFO Channel 00/02 : 0 1 2 3 4 5 6 7\n"
    body = line * (events.QUICK_MIN // len(line) + 10)
    for i in range(events.PROCESS_FILES + 2):
        (logs / f"rank{i}.log").write_bytes(body)
    for config, why in (('[tool.ddp-autopsy]\nselect = ["NOPE999"]\n', "no rule matches"),
                        ('select = ["COLL"]\nignore = ["COLL"]\n', "leave no rule to run")):
        (tmp_path / "ddp-autopsy.toml").write_text(config)
        name = "pyproject.toml" if config.startswith("[tool") else "ddp-autopsy.toml"
        (tmp_path / "ddp-autopsy.toml").rename(tmp_path / name)
        run = subprocess.run([sys.executable, "-m", "ddp_autopsy", "analyze", str(logs),
                              "--format", "json"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        (tmp_path / name).unlink()
        assert run.returncode == 2 and run.stdout == ""
        assert run.stderr.startswith("ddp-autopsy: configuration: ") and why in run.stderr
        assert len(run.stderr.splitlines()) == 1
    assert not _children()


_FORK_WATCH = """
import os, sys
fork = os.fork
def watched():
    kind = type(sys.modules.get("polars")).__name__
    os.write(2, f"fork {kind}\\n".encode())
    return fork()
os.fork = watched
if sys.argv.pop(1) == "first":
    import polars
from ddp_autopsy.cli import main
sys.argv[0] = "ddp-autopsy"
main()
"""


def test_the_workers_fork_before_polars_is_imported(tmp_path: Path) -> None:
    """``analyze`` imports polars while its workers read, not before they fork (~0.1 s of one
    core; ``deferred``): at each fork ``import polars`` still gives the stand-in, and the report
    is that of a run that imported polars first."""
    import json
    import subprocess
    import sys

    line = b"host1:123:456 [0] NCCL INFO Channel 00/02 : 0 1 2 3 4 5 6 7\n"
    body = line * (events.QUICK_MIN // len(line) + 10)
    for i in range(events.PROCESS_FILES + 2):
        oom = f"[rank{i}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
        (tmp_path / f"rank{i}.log").write_bytes(body + (oom.encode() if i == 7 else b""))
    got = {}
    for how in ("deferred", "first"):
        run = subprocess.run([sys.executable, "-c", _FORK_WATCH, how, "analyze", str(tmp_path),
                              "--format", "json"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        forks = run.stderr.splitlines()
        assert forks == [f"fork {'_Deferred' if how == 'deferred' else 'module'}"] * 2, forks
        report = json.loads(run.stdout)
        got[how] = report["verdict"], report["findings"]
    assert got["deferred"] == got["first"] and got["deferred"][0]["ranks"] == [7]
