"""The merged stack tree (analyzer/stacktree.py) and its terminal rendering (reports/stacks_text)."""

from __future__ import annotations

import doctest
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from rich.console import Console

from ddp_autopsy.analyzer import stacktree
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.analyzer.stacks import STACK_SCHEMA
from ddp_autopsy.analyzer.stacktree import build, short_ranks, who
from ddp_autopsy.reports import stacks_text
from ddp_autopsy.rules.engine import run as run_rules

WAIT = [("all_reduce", "torch/distributed/distributed_c10d.py", 3252),
        ("wrapper", "torch/distributed/c10d_logger.py", 83),
        ("main", "train.py", 48), ("<module>", "train.py", 60)]
EVAL = [("evaluate", "train.py", 30), ("main", "train.py", 52), ("<module>", "train.py", 60)]


def thread(rank: int | None, frames: list[tuple[str, str, int]], *, pid: int | None = None,
           tid: int | None = None, name: str | None = "MainThread", idle: bool = True,
           gil: bool = False, host: str = "n1", source: str | None = None) -> list[dict[str, Any]]:
    """Rows of one dumped thread, innermost frame first (as py-spy prints them)."""
    pid = pid if pid is not None else 1000 + (rank or 0)
    return [dict(source=source or f"stack_rank{rank}.txt", host=host, pid=pid, rank=rank,
                 local_rank=rank, thread_id=tid if tid is not None else pid, thread_name=name,
                 idle=idle, owns_gil=gil, depth=d, func=f, file=fl, line=ln)
            for d, (f, fl, ln) in enumerate(frames)]


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=STACK_SCHEMA)


def test_doctests() -> None:
    for module in (stacktree, stacks_text):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_classes_outliers_and_the_prefix_tree() -> None:
    rows = [r for rank in (0, 1, 3, 4, 5) for r in thread(rank, WAIT)] + thread(2, EVAL)
    tree = build(frame(rows))
    assert [(c.id, c.label, c.size) for c in tree.classes] == [
        ("S1", "ranks 0-1,3-5", 5), ("S2", "rank 2", 1)]
    big, odd = tree.classes
    assert big.collective is not None and big.collective.func == "all_reduce"
    assert odd.collective is None and odd.user_frame is not None
    assert odd.user_frame.func == "evaluate" and odd.place == "evaluation"
    assert tree.outliers == [odd] and tree.majority is big
    assert str(odd.diverges_at) == "<module> (train.py:60)"
    # One shared <module> node, then one branch per class, outermost frame first.
    (top,) = tree.root.children
    assert [f.func for f in top.frames] == ["<module>"] and top.label == "ranks 0-5"
    assert [c.label for c in top.children] == ["ranks 0-1,3-5", "rank 2"]
    waiting, elsewhere = top.children
    assert [f.func for f in waiting.frames] == ["main", "wrapper", "all_reduce"]
    assert len(waiting.ends) == 5 and not waiting.outlier and elsewhere.outlier
    assert (waiting.ending, elsewhere.ending, top.ending) == ((0,), (1,), ())
    assert tree.by_rank()[2] is odd and tree.by_rank()[4] is big


def test_identical_stacks_make_one_class_and_one_node() -> None:
    rows = [r for rank in range(8) for r in thread(rank, WAIT)]
    tree = build(frame(rows))
    assert len(tree.classes) == 1 and tree.outliers == [] and tree.majority is tree.classes[0]
    assert [len(n.frames) for _, n in tree.root.walk()] == [0, 4]  # path-compressed


def test_a_stack_that_is_a_prefix_of_another_ends_inside_the_tree() -> None:
    rows = [r for rank in (0, 1, 2) for r in thread(rank, WAIT)] + thread(3, WAIT[2:])
    tree = build(frame(rows))
    (top,) = tree.root.children
    assert [f.func for f in top.frames] == ["<module>", "main"] and top.ending == (1,)
    assert tree.classes[1].label == "rank 3" and tree.classes[1].innermost.func == "main"
    assert [c.label for c in top.children] == ["ranks 0-2"] and top.children[0].ending == (0,)


def test_a_tie_has_no_majority_and_no_outlier() -> None:
    rows = [r for rank in (0, 1) for r in thread(rank, WAIT)]
    rows += [r for rank in (2, 3) for r in thread(rank, EVAL)]
    tree = build(frame(rows))
    assert len(tree.classes) == 2 and tree.majority is None and tree.outliers == []


def test_processes_without_a_rank_are_labelled_by_pid() -> None:
    rows = thread(None, WAIT, pid=4243, source="dump.txt") + thread(None, WAIT, pid=4244,
                                                                      source="dump.txt")
    rows += thread(None, EVAL, pid=4242, source="dump.txt")
    rows += thread(None, WAIT, pid=4245, source="dump.txt")
    tree = build(frame(rows))
    assert [c.label for c in tree.classes] == ["pids 4243,4244,4245", "pid 4242"]
    assert tree.outliers[0].label == "pid 4242"


def test_main_thread_is_the_pid_thread_then_mainthread_then_the_first() -> None:
    other = [("run", "threading.py", 975)]
    rows = thread(0, other, tid=7, name="worker", idle=True) + thread(0, WAIT, tid=1000)
    rows += thread(1, other, tid=8, name="x") + thread(1, WAIT, tid=9, name="MainThread")
    rows += thread(2, WAIT, tid=10, name=None) + thread(2, other, tid=11, name=None)
    tree = build(frame(rows))
    assert len(tree.classes) == 1 and tree.classes[0].label == "ranks 0-2"


def test_other_threads_that_matter_are_merged_by_name() -> None:
    pin = [("_worker", "torch/utils/data/_utils/pin_memory.py", 50), ("run", "threading.py", 975)]
    rows = []
    for rank in range(4):
        rows += thread(rank, WAIT)
        rows += thread(rank, pin, tid=9000 + rank, name="pin_memory", idle=rank % 2 == 1)
        rows += thread(rank, [("wait", "threading.py", 300)], tid=9100 + rank, name="idle_one")
    tree = build(frame(rows))
    assert tree.threads is not None
    assert [(c.label, c.threads) for c in tree.threads.classes] == [("ranks 0,2", ("pin_memory",))]
    (node,) = tree.threads.root.children
    assert node.thread == "pin_memory" and node.frames == ()
    everything = build(frame(rows), all_threads=True)
    assert everything.threads is not None
    assert {c.threads[0] for c in everything.threads.classes} == {"pin_memory", "idle_one"}


def test_agents_and_dataloader_workers_go_to_their_own_trees() -> None:
    agent = [("_invoke_run", "torch/distributed/elastic/agent/server/api.py", 923)]
    loader = [("_worker_loop", "torch/utils/data/_utils/worker.py", 300)]
    rows = [r for rank in range(3) for r in thread(rank, WAIT)]
    rows += thread(None, agent, pid=50, source="agent.json")
    rows += thread(None, loader, pid=60, source="dl.json")
    processes = pl.DataFrame(
        [{"bundle": "b", "host": "n1", "pid": 50, "ppid": 1, "role": "agent", "rank": None,
          "local_rank": None, "world_size": None, "stack_status": "ok"},
         {"bundle": "b", "host": "n1", "pid": 60, "ppid": 1000, "role": "dataloader",
          "rank": None, "local_rank": None, "world_size": None, "stack_status": "ok"}]
        + [{"bundle": "b", "host": "n1", "pid": 1000 + r, "ppid": 50, "role": "worker",
            "rank": r, "local_rank": r, "world_size": 3, "stack_status": "ok"} for r in range(3)],
        schema={"bundle": pl.String, "host": pl.String, "pid": pl.Int64, "ppid": pl.Int64,
                "role": pl.String, "rank": pl.Int64, "local_rank": pl.Int64,
                "world_size": pl.Int64, "stack_status": pl.String})
    tree = build(frame(rows), processes)
    assert tree.label == "ranks 0-2" and len(tree.classes) == 1
    assert set(tree.side) == {"agent", "dataloader"}
    assert tree.side["agent"].label == "pid 50" and tree.side["dataloader"].label == "pid 60"
    assert tree.side["agent"].procs[0].role == "agent"
    kept = build(frame(rows), processes, side_roles=())
    assert kept.side == {} and len(kept.procs) == 5


def test_function_granularity_merges_lines_of_one_function() -> None:
    a = [("step", "train.py", 10), ("main", "train.py", 48)]
    b = [("step", "train.py", 11), ("main", "train.py", 48)]
    rows = thread(0, a) + thread(1, b)
    assert len(build(frame(rows)).classes) == 2
    merged = build(frame(rows), granularity="function")
    assert len(merged.classes) == 1 and merged.classes[0].frames[0].line is None


def test_to_dict_is_json_and_mirrors_the_tree() -> None:
    rows = [r for rank in (0, 1, 3) for r in thread(rank, WAIT)] + thread(2, EVAL)
    data = json.loads(json.dumps(build(frame(rows)).to_dict()))
    assert data["processes"] == 4 and data["outliers"] == ["S2"]
    assert data["classes"][1]["user_frame"] == {"func": "evaluate", "file": "train.py",
                                                "line": 30, "native": False}
    top = data["tree"]["children"][0]
    assert top["label"] == "ranks 0-3" and [c["count"] for c in top["children"]] == [3, 1]


def test_empty_stacks_make_an_empty_tree() -> None:
    tree = build(pl.DataFrame(schema=STACK_SCHEMA))
    assert tree.procs == [] and tree.classes == [] and tree.root.children == []
    out = io.StringIO()
    stacks_text.render(Console(file=out), tree)
    assert out.getvalue() == ""


def test_labels_stay_short_for_scattered_ranks() -> None:
    procs = [stacktree.Proc("s", None, None, r, None, None, None, True, False)
             for r in range(0, 4096, 2)]
    assert who(procs) == "ranks 0,2,4,6,8,10,12,…,4094 (2048 ranks)"
    assert short_ranks([5]) == "5" and short_ranks(range(10)) == "0-9"


def test_from_job_reads_pyspy_dumps(tmp_path: Path) -> None:
    for rank, frames in ((0, WAIT), (1, WAIT), (2, EVAL)):
        body = "".join(f"    {f} ({fl}:{ln})\n" for f, fl, ln in frames)
        (tmp_path / f"stack_rank{rank}.txt").write_text(
            f"Process {4240 + rank}: python -u train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            f'Thread {4240 + rank} (idle): "MainThread"\n{body}')
    tree = stacktree.from_job(load([tmp_path]))
    assert [c.label for c in tree.classes] == ["ranks 0-1", "rank 2"]
    assert tree.outliers[0].user_frame is not None
    assert tree.outliers[0].user_frame.func == "evaluate"


def test_terminal_tree_prints_log_text_literally() -> None:
    hostile = [("[bold red]boom[/]", "train.py", 1), ("main", "train.py", 2)]
    rows = [r for rank in (0, 1, 2) for r in thread(rank, WAIT)] + thread(3, hostile)
    out = io.StringIO()
    stacks_text.render(Console(file=out, width=120, color_system=None), build(frame(rows)))
    text = out.getvalue()
    assert "[bold red]boom[/]" in text and "OUTLIER" in text
    assert "ranks 0-2" in text and "waiting in all_reduce" in text


HANGS = ["stuck_in_eval", "stuck_in_dataloader", "stuck_checkpoint_spawn"]


@pytest.mark.scenario
@pytest.mark.parametrize("name", HANGS)
def test_stuck_rank_rule_names_the_tree_outliers(name: str,
                                                 scenario_run: Callable[[str], Any]) -> None:
    """On real hangs (the bundle collect took), COLL002 names exactly the merged tree's
    outliers: the rule is built on the same tree."""
    run = scenario_run(name)
    assert run.bundle is not None, run.error
    job = load([run.bundle])
    tree = stacktree.from_job(job)
    outliers = sorted(p.rank for c in tree.outliers for p in tree.members(c.members))
    (stuck,) = [f for f in run_rules(job).findings if f.rule == "COLL002"]
    assert stuck.cause == "rank_stuck_outside_collective"
    assert sorted(stuck.ranks) == outliers == run.expect["ranks"]
    assert stuck.details["stack_class"] == tree.outliers[0].id


def synthetic_stacks(n: int, depth: int = 40, odd: int = 1234,
                     distinct: bool = False) -> pl.DataFrame:
    """``n`` ranks' main threads, ``depth`` frames each; rank ``odd`` in evaluate."""
    cols: dict[str, list[Any]] = {k: [] for k in STACK_SCHEMA}
    for r in range(n):
        inner = [("evaluate", "train.py", 30)] if r == odd else WAIT[:2]
        layers = [("forward", f"model/layer{i}.py", 100 + (r if distinct else 0))
                  for i in range(depth - len(inner) - 2)]
        frames = [*inner, *layers, ("main", "train.py", 48), ("<module>", "train.py", 60)]
        for d, (f, fl, ln) in enumerate(frames):
            for k, v in zip(STACK_SCHEMA, (f"rank{r}.txt", f"n{r // 8}", 10000 + r, r, r % 8,
                                           10000 + r, "MainThread", True, False, d, f, fl, ln, False,
                                           None),
                            strict=True):
                cols[k].append(v)
    return pl.DataFrame(cols, schema=STACK_SCHEMA)


@pytest.mark.parametrize("distinct", [False, True], ids=["one-outlier", "all-distinct"])
def test_4096_ranks_by_40_frames(distinct: bool) -> None:
    """The tree at 4096 ranks (its speed is measured in benchmarks/, not asserted here: a timed
    test fails on a loaded machine)."""
    stacks = synthetic_stacks(4096, 40, distinct=distinct)
    tree = build(stacks)
    assert len(tree.procs) == 4096
    if distinct:
        assert len(tree.classes) == 4096 and tree.outliers == []
    else:
        assert [c.label for c in tree.outliers] == ["rank 1234"]
        assert tree.classes[0].label == "ranks 0-1233,1235-4095"


# --- py-spy --native -------------------------------------------------------------------------

#: ``py-spy dump --native`` of two ranks of one Gloo job (abridged from a real dump): the same
#: stack, loaded at different addresses; one libc frame has no symbol.
NATIVE_WAIT = """Process {pid}: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    {addr1} (libc.so.6)
    pthread_cond_wait (libc.so.6)
    std::condition_variable::wait (libstdc++.so.6.0.30)
    c10d::Work::wait (libtorch_cpu.so)
    pybind11::cpp_function::initialize<pybind11::cpp_function::cpp_function<bool, c10d::Work, \
std::chrono::duration<long, std::ratio<(long)1, (long)1000> > > >(bool (*)(c10d::Work*))::\
{{lambda(pybind11::detail::function_call&)#1}}::_FUN (libtorch_python.so)
    pybind11::cpp_function::dispatcher (libtorch_python.so)
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    run (train.py:47)
    <module> (train.py:60)
    {addr2} (libc.so.6)
    {addr3} (libc.so.6)
    _start (python3.11)
"""
NATIVE_EVAL = """Process {pid}: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    clock_nanosleep (libc.so.6)
    time_sleep (libpython3.11.so.1.0)
    evaluate (train.py:22)
    run (train.py:46)
    <module> (train.py:60)
    {addr2} (libc.so.6)
    _start (python3.11)
"""


def _native_dumps(root: Path, ranks: dict[int, str]) -> Path:
    for rank, template in ranks.items():
        pid = 5000 + rank
        addr = [f"0x7f{rank:02x}{n:08x}" for n in range(3)]
        (root / f"stack_rank{rank}.txt").write_text(template.format(
            pid=pid, addr1=addr[0], addr2=addr[1], addr3=addr[2]))
    return root


def test_native_frames_are_normalised_and_folded(tmp_path: Path) -> None:
    from ddp_autopsy.analyzer.stacks import StackOwner, parse_pyspy_text

    dumps = _native_dumps(tmp_path, {0: NATIVE_WAIT})
    rows = parse_pyspy_text((dumps / "stack_rank0.txt").read_text(), StackOwner("s"))
    got = [(r["func"], r["file"], r["line"], r["native"]) for r in rows]
    assert got[0] == ("[unknown]", "libc.so.6", None, True)  # a raw address: its library
    assert got[4] == ("pybind11::cpp_function::initialize<…>(…)::{lambda(…)#1}::_FUN",
                      "libtorch_python.so", None, True)
    assert got[6] == ("all_reduce", "torch/distributed/distributed_c10d.py", 3252, False)
    # two unknown libc frames in a row are one frame
    assert got[-2:] == [("[unknown]", "libc.so.6", None, True),
                        ("_start", "python3.11", None, True)]
    assert [r["depth"] for r in rows] == list(range(len(rows)))


def test_native_stacks_merge_and_the_verdict_names_the_user_frame(tmp_path: Path) -> None:
    """Each rank's dump has its own addresses: the tree still merges them, the classes are the
    ones the Python frames make, and the outlier is named by its Python frame, not by libc."""
    dumps = _native_dumps(tmp_path, {0: NATIVE_WAIT, 1: NATIVE_EVAL, 2: NATIVE_WAIT,
                                     3: NATIVE_WAIT})
    job = load([dumps])
    tree = stacktree.from_job(job)
    assert [c.label for c in tree.classes] == ["ranks 0,2-3", "rank 1"]
    odd = tree.outliers[0]
    assert str(odd.user_frame) == "evaluate (train.py:22)" and odd.place == "evaluation"
    assert str(odd.diverges_at) == "<module> (train.py:60)"
    assert tree.classes[0].collective is not None
    (top,) = tree.root.children  # one root: the per-process outermost addresses are gone
    assert [str(f) for f in top.frames] == ["<module> (train.py:60)"]
    wait, evaluating = top.children
    # native frames beneath the innermost Python frame, innermost last
    assert [f.func for f in wait.frames][-5:] == [
        "pybind11::cpp_function::initialize<…>(…)::{lambda(…)#1}::_FUN", "c10d::Work::wait",
        "std::condition_variable::wait", "pthread_cond_wait", "[unknown]"]
    assert [str(f) for f in evaluating.frames] == [
        "run (train.py:46)", "evaluate (train.py:22)", "time_sleep (libpython3.11.so.1.0)",
        "clock_nanosleep (libc.so.6)"]
    (stuck,) = [f for f in run_rules(job).findings if f.rule == "COLL002"]
    assert stuck.ranks == [1] and "evaluate (train.py:22)" in stuck.summary
    assert "libc" not in stuck.summary
    out = io.StringIO()
    stacks_text.render(Console(file=out, width=200, color_system=None), tree)
    text = out.getvalue()
    assert "clock_nanosleep  libc.so.6  [native]" in text and "0x7f" not in text
    assert text.index("evaluate  train.py:22") < text.index("clock_nanosleep")
    from ddp_autopsy.reports import html

    page = html.render(run_rules(job))
    assert "clock_nanosleep (libc.so.6)" in page and ":None" not in page


def test_a_native_difference_alone_makes_no_outlier(tmp_path: Path) -> None:
    """Rank 3 is caught in another libc call under the same Python frames: same class."""
    other = NATIVE_WAIT.replace("pthread_cond_wait (libc.so.6)", "__futex_abstimed_wait (libc.so.6)")
    dumps = _native_dumps(tmp_path, {0: NATIVE_WAIT, 1: NATIVE_WAIT, 2: NATIVE_WAIT, 3: other})
    tree = stacktree.from_job(load([dumps]))
    assert [c.label for c in tree.classes] == ["ranks 0-3"] and tree.outliers == []
    shown = [f.func for _, n in tree.root.walk() for f in n.frames]
    assert "pthread_cond_wait" in shown and "__futex_abstimed_wait" not in shown  # the majority


@pytest.mark.scenario
def test_collect_native_of_a_real_job_keeps_stacks_mergeable(tmp_path: Path) -> None:
    """A real hung mp.spawn Gloo job (rank 1 in evaluate, ranks 0 and 2 in all_reduce),
    collected with --native: native frames in the dumps, the same classes and verdict as
    without them, no raw address in the tree."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import collect_helpers as h

    from ddp_autopsy.collectors import CollectOptions, collect
    from ddp_autopsy.collectors.pyspy import find_pyspy

    job = h.start_spawn(tmp_path / "spawn", nprocs=3)
    try:
        job.wait_ready(3, 120)
        pyspy = find_pyspy()
        assert pyspy, "py-spy is a core dependency: it is installed beside the interpreter"
        probe = subprocess.run([pyspy, "dump", "--native", "--pid", str(job.ranks[1])],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            pytest.skip(f"py-spy --native cannot attach here: {probe.stderr.strip()[:200]}")
        native = collect(CollectOptions(pid=job.pid, out=tmp_path / "native", native=True))
        plain = collect(CollectOptions(pid=job.pid, out=tmp_path / "plain"))
    finally:
        job.stop()
    njob, pjob = load([native.bundle]), load([plain.bundle])
    assert njob.stacks.filter(pl.col("native")).height > 0
    assert not pjob.stacks.filter(pl.col("native").fill_null(False)).height
    ntree, ptree = stacktree.from_job(njob), stacktree.from_job(pjob)
    assert [c.label for c in ntree.classes] == [c.label for c in ptree.classes] == [
        "ranks 0,2", "rank 1"]
    assert str(ntree.outliers[0].user_frame) == str(ptree.outliers[0].user_frame)
    assert ntree.outliers[0].user_frame.func == "evaluate"
    assert len(ntree.root.children) == 1
    funcs = [f.func for _, n in ntree.root.walk() for f in n.frames]
    assert not any(f.startswith("0x") for f in funcs)
    assert any(f.native for _, n in ntree.root.walk() for f in n.frames)
    nverdict, pverdict = run_rules(njob).verdict, run_rules(pjob).verdict
    assert nverdict is not None and pverdict is not None
    assert (nverdict.rule, nverdict.ranks) == (pverdict.rule, pverdict.ranks) == ("COLL002", [1])
    assert ".so" not in nverdict.summary
    # Both bundles together: two snapshots of the same processes, one native, one not. None
    # moved (native frames are no movement), and where each is reads as Python frames.
    both = load([native.bundle, plain.bundle])
    moves = [m for m in both.snapshot_moves if m.rank is not None]
    assert sorted(m.rank for m in moves) == [0, 1, 2], both.snapshot_moves
    assert not [m for m in moves if m.moved], moves
    assert not [m for m in moves if ".so" in m.last or "None" in m.last], moves
