"""What a verdict says, where the words are the finding: the source a failure came from, the
platform's own remedy, the launcher's notation."""

from __future__ import annotations

from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

CASES = Path(__file__).parent / "rules" / "cases"


def verdict(case: str):
    files = [p for p in (CASES / case).iterdir() if p.name != "expect.json"]
    found = run(load(files)).verdict
    assert found is not None
    return found


def test_a_zeromq_socket_is_not_the_rendezvous_store() -> None:
    v = verdict("RDZV001-zmq-socket")
    assert "ZeroMQ socket could not bind tcp://10.0.0.58:40043" in v.summary
    assert "VLLM_PORT" in v.remedy and "--master-port" not in v.remedy


def test_torch_store_bind_keeps_its_own_remedy() -> None:
    v = verdict("RDZV001-winsock-10048")
    assert v.summary.startswith("The rendezvous store could not bind port 10086")
    assert "--master-port <a free port, not 10086>" in v.remedy


def test_windows_builds_have_no_nccl() -> None:
    assert "Windows builds of PyTorch have no NCCL" in verdict("ENV003-windows-no-nccl").summary


def test_host_slots_passed_to_ssh_is_explained() -> None:
    assert "-H host:slots" in verdict("RDZV002-ssh-host-slots").summary


def test_several_killed_ranks_agree_in_number() -> None:
    assert verdict("CRASH002-srun-tasks-killed").summary.startswith(
        "Ranks 4-7 were killed with SIGKILL")


def test_a_bar_the_timeout_was_glued_to_is_quoted_without_a_rank() -> None:
    summary = verdict("COLL012-timeout-glued-to-a-bar").summary
    assert "no line from rank 0 says what it was doing (the progress bar" in summary
    assert "497/499" in summary


def test_the_same_call_at_other_sequence_numbers_is_said_so() -> None:
    summary = verdict("COLL001-fingerprint-same-call-other-seq").summary
    assert "same call, BARRIER, at different points" in summary and "rank 1 at #1" in summary


def test_a_teardown_alone_names_the_pid_it_skipped() -> None:
    assert "pid 854278, missing from the run of pids it stopped" in verdict(
        "CRASH001-teardown-only").summary


def test_a_full_shm_is_not_read_as_segments_removed_under_the_job() -> None:
    # (a peer's unlink warning beside the "No space left" extend failure: too small)
    assert "is too small" in verdict("NCCL003-full-shm-beside-unlink-warning").summary
    assert "RemoveIPC" in verdict("NCCL003-segment-removed-under-job").summary


def test_a_time_limit_names_only_ranks_whose_last_line_came_first() -> None:
    v = verdict("COLL012-behind-at-time-limit")
    assert v.ranks == [3] and "running step 1/10`, and rank 3's did not" in v.summary


def test_a_resource_limit_signal_says_which_limit() -> None:
    assert "CPU-time limit (`ulimit -t`" in verdict("CRASH001-cpu-time-limit-signal").summary


def test_a_rank_of_three_that_alone_aborts_on_gloo_size_check_is_named_as_a_lead() -> None:
    v = verdict("NCCL007-gloo-one-of-three-aborts")
    assert v.ranks == [1] and "Rank 1's buffer was smaller than its sender's" in v.summary
    assert "if instead one rank had more, it is the one that sent to rank 1" in v.summary
