"""Attribution: a missing rank is filled only from an unambiguous mapping, with its cue."""

from __future__ import annotations

import io
from typing import Any

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_autopsy.analyzer import attribution as A
from ddp_autopsy.analyzer.events import EVENT_SCHEMA, FileContext, scan_text

WATCHDOG = ("[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
            "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")
PEER = "[E socket.cpp:1] recvValue failed: Failed to recv, got 0 bytes."
INIT = ("{h}:{p}:{p} [{d}] NCCL INFO ncclCommInitRank comm 0x55d0c3a0 rank {r} nranks {n} "
        "cudaDev {d} nvmlDev {d} busId 1a000 commId 0x3f2a - Init COMPLETE")
IB = ("{h}:{p}:{p} [{d}] transport/net_ib.cc:1696 NCCL WARN NET/IB: Got completion from peer "
      "10.1.0.9<46213> with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_0")


def frame(*sources: tuple[str, str, dict[str, Any]]) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    for name, text, ctx in sources:
        rows += scan_text(io.BytesIO(text.encode()), FileContext(name, 2025, **ctx), [])
    rows = [r for r in rows if r["kind"] != "last_line"]  # each writer's last line: not here
    return pl.DataFrame(rows, schema=EVENT_SCHEMA, orient="row")


def ranks(df: pl.DataFrame, kind: str) -> list[tuple[int | None, str | None]]:
    return [(r["rank"], r["cue"]) for r in df.filter(pl.col("kind") == kind).iter_rows(named=True)]


def test_launcher_prefix_maps_through_ranked_lines() -> None:
    text = "\n".join([f"[default1]:[rank5]:{WATCHDOG.format(r=5)}", f"[default1]:{PEER}"])
    df = A.resolve(frame(("out.log", text, {})))
    assert ranks(df, "peer_closed") == [(5, A.STREAM_CUE)]


def test_a_writer_naming_two_ranks_stays_unknown() -> None:
    text = "\n".join([f"[default1]:[rank5]:{WATCHDOG.format(r=5)}",
                      f"[default1]:[rank9]:{WATCHDOG.format(r=9)}", f"[default1]:{PEER}"])
    df = A.resolve(frame(("out.log", text, {})))
    assert ranks(df, "peer_closed") == [(None, None)]


def test_srun_tasks_are_ranks_when_ranked_lines_confirm_them() -> None:
    text = "\n".join([f"0: [rank0]:{WATCHDOG.format(r=0)}", f"1: [rank1]:{WATCHDOG.format(r=1)}",
                      f"2: {PEER}", f"0: {PEER}", "1: step 1", "2: step 1"])
    df = A.resolve(frame(("slurm-1.out", text, {})))
    assert ranks(df, "peer_closed") == [(2, A.TASK_CUE), (0, A.TASK_CUE)]


def test_srun_tasks_running_torchrun_are_nodes_not_ranks() -> None:
    text = "\n".join([f"0: [default0]:[rank0]:{WATCHDOG.format(r=0)}",
                      f"1: [default0]:[rank4]:{WATCHDOG.format(r=4)}", f"1: {PEER}", "0: x"])
    df = A.resolve(frame(("slurm-1.out", text, {})))
    assert ranks(df, "peer_closed") == [(None, None)]


def test_one_confirmation_is_not_enough_for_many_tasks() -> None:
    text = "\n".join([f"0: [rank0]:{WATCHDOG.format(r=0)}", f"1: {PEER}", "2: x", "3: y"])
    df = A.resolve(frame(("slurm-1.out", text, {})))
    assert ranks(df, "peer_closed") == [(None, None)]


def test_nccl_world_communicator_names_the_process() -> None:
    lines = [INIT.format(h="n1", p=77, d=1, r=3, n=8), INIT.format(h="n1", p=77, d=1, r=1, n=2),
             IB.format(h="n1", p=77, d=1)]
    df = A.resolve(frame(("n1.77", "\n".join(lines), {"host": "n1", "pid": 77})))
    assert ranks(df, "network_error") == [(3, A.STREAM_CUE)]
    # The sub-communicator's line is the same process: world rank 3 too.
    assert ranks(df, "nccl_comm_init") == [(3, A.NCCL_CUE), (3, A.STREAM_CUE)]


def test_nccl_2_29_job_rank_prefix() -> None:
    line = ("n1:77:77 [1] NCCL INFO [Rank 12] ncclCommInitRankConfig comm 0x5 rank 0 nranks 4 "
            "cudaDev 1 nvmlDev 1 busId 1a000 commId 0x3f2a - Init START")
    df = A.resolve(frame(("n1.77", line, {})))
    assert ranks(df, "nccl_comm_init") == [(12, "message [Rank N]")]


def test_host_and_pid_map_across_files() -> None:
    summary = "\n".join(["Root Cause (first observed failure):", "[0]:",
                         "  time      : 2026-01-15_05:44:28", "  host      : n1.cluster.local",
                         "  rank      : 6 (local_rank: 2)", "  exitcode  : -6 (pid: 77)",
                         "  error_file: <N/A>", "  traceback : Signal 6 (SIGABRT) received"])
    df = A.resolve(frame(("agent.log", summary, {}), ("n1.77", IB.format(h="n1", p=77, d=2),
                                                      {"host": "n1", "pid": 77})))
    assert ranks(df, "elastic_failure") == [(6, "torchelastic failure summary")]
    assert ranks(df, "network_error") == [(6, A.PID_CUE)]


def test_bundle_processes_map_host_and_pid() -> None:
    df = frame(("n1.77", IB.format(h="n1", p=77, d=2), {}))
    procs = pl.DataFrame({"host": ["n1"], "pid": [77], "rank": [13]})
    assert ranks(A.resolve(df, procs), "network_error") == [(13, A.PID_CUE)]


def test_failure_summary_does_not_name_the_agent() -> None:
    summary = "\n".join(["  0: Root Cause (first observed failure):", "  0: [0]:",
                         "  0:   rank      : 6 (local_rank: 2)", "  0:   exitcode  : -6 (pid: 77)",
                         f"  0: {PEER}", "  1: x", "  0: y"])
    df = A.resolve(frame(("slurm.out", summary, {})))
    assert ranks(df, "peer_closed") == [(None, None)]


def test_resolve_is_idempotent_and_keeps_order() -> None:
    text = "\n".join([f"[default1]:[rank5]:{WATCHDOG.format(r=5)}", f"[default1]:{PEER}",
                      f"[default0]:{PEER}"])
    once = A.resolve(frame(("out.log", text, {})))
    assert once.equals(A.resolve(once))
    assert once["line"].to_list() == [1, 2, 3]


def test_empty_frame() -> None:
    assert A.resolve(pl.DataFrame(schema=EVENT_SCHEMA)).height == 0


CUES = st.sampled_from([None, "torch [rankN]: prefix", "message [Rank N]",
                        "torchelastic failure summary", "mp.spawn process index"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.log", "b.log"]), st.none() | st.integers(0, 3),
                          st.sampled_from([None, "l=0", "t=1", "s=2", "h=n1|t=0", "file"]),
                          st.none() | st.sampled_from(["n1", "n1.x", "n2"]),
                          st.none() | st.integers(1, 3), CUES,
                          st.sampled_from(["peer_closed", "nccl_comm_init"]),
                          st.sampled_from([None, '{"nranks": 4, "comm_rank": 1}', "{}"])),
                max_size=25))
def test_resolve_never_raises_nor_changes_a_known_rank(rows: list[tuple]) -> None:
    data = [dict(zip(("source", "rank", "stream", "host", "pid", "cue", "kind", "data"), r,
                     strict=True)) for r in rows]
    base = {k: None for k in EVENT_SCHEMA}
    df = pl.DataFrame([{**base, **d, "rank": d["rank"] if d["cue"] else None, "line": i}
                       for i, d in enumerate(data)], schema=EVENT_SCHEMA, orient="row")
    out = A.resolve(df)
    assert out.columns == df.columns and out.height == df.height
    known = df["rank"].is_not_null()
    assert out.filter(known)["rank"].to_list() == df.filter(known)["rank"].to_list()


FAILED = ("torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) "
          "local_rank: {lr} (pid: 14447) of binary: /usr/bin/python3")


def test_on_the_only_node_a_local_rank_is_the_rank() -> None:
    text = "\n".join([f"[default2]:{PEER}", FAILED.format(lr=2)])
    df = A.resolve(frame(("out.log", text, {})))
    assert ranks(df, "peer_closed") == [(2, A.ONE_NODE_CUE)]
    assert ranks(df, "worker_failed") == [(2, A.ONE_NODE_CUE)]


def test_two_hosts_keep_local_ranks_local() -> None:
    text = "\n".join([f"node-a: {FAILED.format(lr=2)}", f"node-b: {FAILED.format(lr=1)}"])
    df = A.resolve(frame(("pdsh.log", text, {})))
    assert ranks(df, "worker_failed") == [(None, None), (None, None)]


def test_a_rank_paired_with_another_local_rank_shows_a_second_node() -> None:
    text = "\n".join([f"[default1]:[rank5]:{WATCHDOG.format(r=5)}", FAILED.format(lr=3)])
    df = A.resolve(frame(("out.log", text, {})))
    assert ranks(df, "worker_failed") == [(None, None)]


def test_a_launch_for_two_nodes_keeps_local_ranks_local() -> None:
    text = "\n".join(["torchrun --nnodes=2 --nproc-per-node=4 train.py", FAILED.format(lr=2)])
    df = A.resolve(frame(("out.log", text, {})))
    assert ranks(df, "worker_failed") == [(None, None)]
    assert A.declared_nodes(df) == 2


GATHER = ("[rank1]:[E407 10:02:26.551756518 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog caught "
          "collective operation timeout: WorkNCCL(SeqNum=49209, OpType={op}, NumelIn={nin}, "
          "NumelOut={nout}, Timeout(ms)=1800000) ran for 1800056 milliseconds before timing out.")


def test_an_all_gathers_sizes_give_its_group_size() -> None:
    df = frame(("out.log", GATHER.format(op="ALLGATHER", nin=43, nout=172), {}))
    assert A.gathered_group_size(df) == 4
    df = frame(("out.log", GATHER.format(op="_REDUCE_SCATTER_BASE", nin=96, nout=12), {}))
    assert A.gathered_group_size(df) == 8


def test_other_collectives_and_odd_sizes_give_no_group_size() -> None:
    # an all-reduce's sizes are equal whatever the group; sizes that do not divide say nothing
    for op, nin, nout in (("ALLREDUCE", 43, 43), ("ALLGATHER", 43, 100), ("ALLGATHER", 0, 0),
                          ("BROADCAST", 10, 40)):
        assert A.gathered_group_size(frame(("out.log", GATHER.format(
            op=op, nin=nin, nout=nout), {}))) is None


CHANNEL = "{h}:{p}:{t} [{d}] NCCL INFO Channel 00/0 : {a}[{d}] -> {b}[{e}] {via}"
SHM_WARN = "{h}:{p}:{t} [{d}] include/shm.h:42 NCCL WARN Cuda failure 'invalid argument'"


def test_nccl_channel_set_up_names_its_process() -> None:
    # the sender of a P2P/SHM/[send] channel, the receiver of a [receive] one
    lines = [CHANNEL.format(h="n1", p=70, t=71, d=2, a=2, b=3, e=3, via="via P2P/IPC"),
             CHANNEL.format(h="n1", p=80, t=81, d=3, a=9, b=3, e=1, via="[receive] via NET/IB/0"),
             SHM_WARN.format(h="n1", p=70, t=71, d=2), IB.format(h="n1", p=80, d=3)]
    df = A.resolve(frame(("n1.log", "\n".join(lines), {})))
    assert ranks(df, "cuda_failure") == [(2, A.CHANNEL_CUE)]
    assert ranks(df, "network_error") == [(3, A.CHANNEL_CUE)]


def test_nccl_channels_of_two_communicator_sizes_name_nobody() -> None:
    # a sub-communicator's channel ranks are not the job's: with two sizes in the inputs, the
    # channel line's communicator is not known
    lines = [INIT.format(h="n1", p=90, d=1, r=5, n=8), INIT.format(h="n1", p=91, d=2, r=1, n=2),
             CHANNEL.format(h="n1", p=70, t=71, d=2, a=1, b=0, e=0, via="via P2P/IPC"),
             SHM_WARN.format(h="n1", p=70, t=71, d=2)]
    df = A.resolve(frame(("n1.log", "\n".join(lines), {})))
    assert ranks(df, "cuda_failure") == [(None, None)]


def test_nccl_channel_rank_never_overrides_the_world_communicator() -> None:
    lines = [INIT.format(h="n1", p=77, d=1, r=3, n=8),
             CHANNEL.format(h="n1", p=77, t=78, d=1, a=0, b=1, e=2, via="via P2P/IPC"),
             IB.format(h="n1", p=77, d=1)]
    df = A.resolve(frame(("n1.log", "\n".join(lines), {})))
    assert ranks(df, "network_error") == [(3, A.PID_CUE)]


def test_nccl_channel_ranks_below_their_devices_are_a_subgroups() -> None:
    # a tensor-parallel pair on GPUs 4 and 5, its init lines cut: ranks 1 and 0 of its own
    lines = [CHANNEL.format(h="n1", p=70, t=71, d=5, a=1, b=0, e=4, via="via P2P/IPC"),
             SHM_WARN.format(h="n1", p=70, t=71, d=5)]
    df = A.resolve(frame(("n1.log", "\n".join(lines), {})))
    assert ranks(df, "cuda_failure") != [(1, A.CHANNEL_CUE)]
