"""The scenario library itself: each real job failed (or didn't) exactly as designed.

Only raw evidence is checked here: console text, exit codes, torchrun's per-rank log files and
the collected bundles. No analyzer, so a broken scenario is told apart from a wrong diagnosis.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scenarios.runner import SCENARIOS, ScenarioRun

from ddp_autopsy.rules.base import CAUSES as ALL_CAUSES

RunFn = Callable[[str], ScenarioRun]
HANGS = sorted(name for name, spec in SCENARIOS.items() if spec.hang)
CAUSES = {None, *ALL_CAUSES}


def worker_lines(text: str, pattern: str) -> list[str]:
    """Lines matching ``pattern`` anywhere (tolerates ``[defaultN]:`` prefixes and lines that
    two processes wrote into each other)."""
    return re.findall(pattern, text)


def bundle_stacks(run: ScenarioRun) -> dict[int, list[str]]:
    """{rank: frame names of the main thread, innermost first} from the collected bundle."""
    assert run.bundle is not None and (run.bundle / "manifest.json").is_file(), run.error
    manifest = json.loads((run.bundle / "manifest.json").read_text())
    stacks: dict[int, list[str]] = {}
    for proc in manifest["processes"]:
        if proc["role"] != "worker":
            continue
        rank = proc["rank"] if proc["rank"] is not None else proc["spawn_index"]
        assert proc["stack_status"] == "ok", proc
        threads: list[dict[str, Any]] = json.loads((run.bundle / proc["stack"]).read_text())
        main = next(t for t in threads if t.get("thread_name") == "MainThread")
        stacks[rank] = [frame["name"] for frame in main["frames"]]
    return stacks


# --------------------------------------------------------------------------- metadata


def test_every_scenario_declares_launch_and_expectation() -> None:
    assert len(SCENARIOS) >= 15
    for name, spec in SCENARIOS.items():
        assert spec.doc, f"{name}: the docstring documents the failure"
        assert set(spec.expect) >= {"cause", "ranks", "notes"}, name
        assert spec.expect["cause"] in CAUSES, name
        if spec.expect["cause"] == "rank_stuck_outside_collective" and spec.hang:
            assert spec.expect.get("frame"), name  # a collected hang names the culprit's frame


def test_programs_import_torch_only_in_their_main_path() -> None:
    for spec in SCENARIOS.values():
        tree = ast.parse(spec.path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] == "torch" for n in names), spec.name


def test_runner_reads_the_library_without_importing_torch() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from scenarios.runner import SCENARIOS;"
        "assert SCENARIOS and 'torch' not in sys.modules, sorted(sys.modules)"
    )
    tests_dir = str(Path(__file__).resolve().parent)
    subprocess.run([sys.executable, "-c", code, tests_dir], check=True, timeout=60)


# --------------------------------------------------------------------------- launch failures


@pytest.mark.scenario("healthy_torchrun")
def test_healthy_torchrun(scenario_run: RunFn) -> None:
    run = scenario_run("healthy_torchrun")
    text = run.console_text()
    assert run.returncode == 0, text
    for rank in range(3):
        assert f"[default{rank}]:rank={rank} done" in text  # --tee 3 prefixes
    assert "Traceback" not in text


@pytest.mark.scenario("port_in_use")
def test_port_in_use(scenario_run: RunFn) -> None:
    run = scenario_run("port_in_use")
    text = run.console_text()
    assert run.returncode == 1
    assert f"port: {run.master_port}, useIpv6: false, code: -98, name: EADDRINUSE" in text
    assert "torch.distributed.DistNetworkError: The server socket has failed to listen" in text
    assert not worker_lines(text, r"rank=\d"), "no worker may have started"


@pytest.mark.scenario("port_busy_then_freed")
def test_port_busy_then_freed(scenario_run: RunFn) -> None:
    run = scenario_run("port_busy_then_freed")
    text = run.console_text()
    assert run.returncodes == [1, 0]
    assert text.count("name: EADDRINUSE") == 1
    first_failure = text.index("EADDRINUSE")
    for rank in range(2):
        assert text.index(f"rank={rank} done") > first_failure


@pytest.mark.scenario("unresolved_host")
def test_unresolved_host(scenario_run: RunFn) -> None:
    run = scenario_run("unresolved_host")
    text = run.console_text()
    assert run.returncode == 1
    host = f"(no-such-host.invalid, {run.master_port})"
    assert f"The IPv6 network addresses of {host} cannot be retrieved (gai error: -2" in text
    assert (
        f"DistNetworkError: The client socket has timed out after 3000ms while trying to "
        f"connect to {host}" in text
    )


@pytest.mark.scenario("resolve_warning_then_success")
def test_resolve_warning_then_success(scenario_run: RunFn) -> None:
    run = scenario_run("resolve_warning_then_success")
    text = run.console_text()
    assert run.returncode == 0, text
    warning = f"network addresses of (trainer-master-0, {run.master_port}) cannot be retrieved"
    assert warning in text
    for rank in range(2):
        assert text.index(f"rank={rank} done") > text.rindex(warning)


@pytest.mark.scenario("master_unreachable")
def test_master_unreachable(scenario_run: RunFn) -> None:
    run = scenario_run("master_unreachable")
    text = run.console_text()
    assert run.returncode == 1
    assert (
        f"DistNetworkError: The client socket has timed out after 3000ms while trying to "
        f"connect to (127.0.0.1, {run.master_port})" in text
    )
    assert "torch.multiprocessing.spawn.ProcessRaisedException" in text
    assert "rank=0" not in text


@pytest.mark.scenario("missing_ranks")
def test_missing_ranks(scenario_run: RunFn) -> None:
    run = scenario_run("missing_ranks")
    text = run.console_text()
    assert run.returncode == 1
    assert re.search(
        r"DistStoreError: Timed out after \d+ seconds waiting for clients\. "
        r"2/3 clients joined\.",
        text,
    )
    assert "rank=0 init_process_group world_size=3" in text
    assert "rank=2" not in text


# --------------------------------------------------------------------------- crashes


@pytest.mark.scenario("collective_mismatch")
def test_collective_mismatch(scenario_run: RunFn) -> None:
    run = scenario_run("collective_mismatch")
    text = run.console_text()
    assert run.returncode == 1
    assert (
        "[default1]:[rank1]: RuntimeError: Detected mismatch between collectives on ranks. "
        "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=3, "
        "OpType=BROADCAST" in text
    )
    assert "ChildFailedError" in text
    logs = run.rank_logs()
    assert sorted(logs) == [0, 1, 2]  # --log-dir: <run_id>/attempt_0/<local_rank>/std*.log
    assert "OpType=BROADCAST" in logs[1]["stderr"].read_text()
    assert "rank=1 step=2" in logs[1]["stdout"].read_text()


@pytest.mark.scenario("collective_mismatch_shape")
def test_collective_mismatch_shape(scenario_run: RunFn) -> None:
    run = scenario_run("collective_mismatch_shape")
    text = run.console_text()
    assert run.returncode == 1
    assert (
        "[rank2]: RuntimeError: Detected mismatch between collectives on ranks. Rank 2 is "
        "running collective: CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE, "
        "TensorShape=[5]" in text
    )
    assert "[default" not in text  # plain torchrun: no tee prefixes


@pytest.mark.scenario("rank_crash_exception")
def test_rank_crash_exception(scenario_run: RunFn) -> None:
    run = scenario_run("rank_crash_exception")
    text = run.console_text()
    assert run.returncode == 1
    assert "[default2]:[rank2]: ValueError: bad batch 17" in text
    assert "Connection closed by peer" in text  # the survivors' symptom
    root = text[text.index("Root Cause (first observed failure):") :]
    assert "rank      : 2 (local_rank: 2)" in root
    assert "ValueError: bad batch 17" in root  # @record put the traceback in the summary


@pytest.mark.scenario("rank_crash_signal")
def test_rank_crash_signal(scenario_run: RunFn) -> None:
    run = scenario_run("rank_crash_signal")
    text = run.console_text()
    assert run.returncode == 1
    root = text[text.index("Root Cause (first observed failure):") :]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "exitcode  : -9" in root and "Signal 9 (SIGKILL) received by PID" in root
    assert not worker_lines(text, r"rank=\d step"), "--redirects 3: worker output in files only"
    logs = run.rank_logs()
    rank1 = logs[1]["stdout"].read_text()
    assert "rank=1 step=1" in rank1 and "rank=1 step=2" not in rank1
    assert "Connection closed by peer" in logs[0]["stderr"].read_text()


@pytest.mark.scenario("rank_crash_spawn")
def test_rank_crash_spawn(scenario_run: RunFn) -> None:
    run = scenario_run("rank_crash_spawn")
    text = run.console_text()
    assert run.returncode == 1
    assert "torch.multiprocessing.spawn.ProcessRaisedException" in text
    assert "-- Process 1 terminated with the following error:" in text
    assert "RuntimeError: loss is NaN at step 2" in text


# --------------------------------------------------------------------------- hangs


@pytest.mark.scenario
@pytest.mark.parametrize("name", HANGS)
def test_hang_collected_with_a_stack_per_rank(scenario_run: RunFn, name: str) -> None:
    run = scenario_run(name)
    assert run.error is None, run.error
    assert run.returncode is None, "a hang must still be running when it is collected"
    stacks = bundle_stacks(run)
    expect = run.expect
    world = int(SCENARIOS[name].launch.get("ready", SCENARIOS[name].launch.get("nproc", 2)))
    assert sorted(stacks) == list(range(world)), stacks
    for rank, frames in stacks.items():
        if rank in expect["ranks"] and expect["cause"] == "uneven_inputs":
            assert expect["frame"] in frames and "backward" not in frames, (rank, frames)
        elif expect["cause"] == "uneven_inputs":
            assert "backward" in frames, (rank, frames)
        elif rank in expect["ranks"]:
            # (where the culprit's stack is, when the verdict names something else: a crash)
            frame = expect.get("stack_frame", expect.get("frame"))
            assert any(f.endswith(frame) for f in frames), (rank, frames)
            if expect["cause"] == "rank_stuck_outside_collective":  # (a mismatch's culprit may
                assert not {"all_reduce", "barrier"} & set(frames), (rank, frames)  # be in one)
        elif expect["cause"] == "rank_stuck_outside_collective":
            assert {"all_reduce", "barrier"} & set(frames), (rank, frames)


@pytest.mark.scenario("all_in_collective_hang")
def test_slow_job_was_still_progressing(scenario_run: RunFn) -> None:
    run = scenario_run("all_in_collective_hang")
    text = run.console_text()
    for rank in range(2):
        steps = [int(s) for s in worker_lines(text, rf"rank={rank} step=(\d+)")]
        assert steps and steps == sorted(steps) and max(steps) >= 3, steps
