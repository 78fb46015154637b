"""Every layout people hand the tool, read without flags and attributed (fixtures written here
from the documented formats: shared/research/pytorch-messages.md and nccl-messages.md)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import polars as pl
import pytest

from ddp_autopsy.analyzer.attribution import resolve
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

WATCHDOG = ("[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")
OOM = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
       "    loss.backward()", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
       "2.00 GiB."]
PEER = "[W socket.cpp:1] recvValue failed: Failed to recv, got 0 bytes."
INIT = ("{h}:{p}:{p} [{d}] NCCL INFO ncclCommInitRank comm 0x55d0c3a0 rank {r} nranks {n} "
        "cudaDev {d} nvmlDev {d} busId 1a000 commId 0x3f2a - Init COMPLETE")
COLL = ("{h}:{p}:{p} [{d}] NCCL INFO AllReduce: opCount {i:x} sendbuff 0x7f00 recvbuff 0x7f00 "
        "count 1024 datatype 7 op 0 root 0 comm 0x55d0c3a0 [nranks={n}] stream 0x7f3c")
IB = ("\n{h}:{p}:{p} [{d}] transport/net_ib.cc:1696 NCCL WARN NET/IB: Got completion from peer "
      "10.1.0.9<46213> with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_0")
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-15_05:44:28
  host      : {host}
  rank      : {rank} (local_rank: {lr})
  exitcode  : -9 (pid: {pid})
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID {pid}
============================================================"""


def events(*paths: Path) -> pl.DataFrame:
    return resolve(load(list(paths)).events)


def who(df: pl.DataFrame, kind: str) -> list[tuple]:
    return [(r["rank"], r["local_rank"], r["host"], r["cue"])
            for r in df.filter(pl.col("kind") == kind).iter_rows(named=True)]


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_torchrun_log_dir_tree(tmp_path: Path) -> None:
    root = tmp_path / "logs" / "0f3e9a_1"
    write(root / "attempt_0" / "0" / "stderr.log", ["starting", f"[rank0]:{WATCHDOG.format(r=0)}"])
    write(root / "attempt_0" / "1" / "stderr.log",
          [*(f"[rank1]: {x}" for x in OOM), PEER])
    df = events(tmp_path / "logs")
    assert who(df, "oom") == [(1, 1, None, "torch [rankN]: prefix")]
    # The file is one worker: its other lines take the rank its ranked lines name.
    assert who(df, "peer_closed") == [(1, 1, None, "launcher prefix mapped via [rankN] lines")]


def test_tee_output_with_launcher_prefixes(tmp_path: Path) -> None:
    lines = [f"[default{lr}]:[rank{lr + 4}]:{WATCHDOG.format(r=lr + 4)}" for lr in range(3)]
    lines += [f"[default2]:{PEER}", "[default0]:epoch 1 done"]
    df = events(write(tmp_path / "node1.out", lines))  # the file of node "node1"
    assert who(df, "peer_closed") == [(6, 2, "node1", "launcher prefix mapped via [rankN] lines")]


def test_custom_log_line_prefix_template(tmp_path: Path) -> None:
    # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${rank}]:" (torch's documented example)
    lines = [f"[{r}]: step {i} loss 0.3" for i in range(3) for r in range(4)]
    lines += ["[0]:[rank0]:" + WATCHDOG.format(r=0), "[1]:[rank1]:" + WATCHDOG.format(r=1),
              f"[3]: {PEER}"]
    df = events(write(tmp_path / "train.log", lines))
    assert who(df, "peer_closed") == [(3, None, None,
                                       "launcher prefix [N]: (confirmed by ranked lines)")]


def test_one_slurm_output_with_interleaved_ranks(tmp_path: Path) -> None:
    lines = [f"{r:>2}: epoch 1 step {i}" for i in range(5) for r in range(12)]
    lines += [f"{r:>2}: [rank{r}]:{WATCHDOG.format(r=r)}" for r in range(12) if r != 7]
    lines += [f" 7: {x}" for x in OOM]
    df = events(write(tmp_path / "slurm-4242.out", lines))
    assert who(df, "oom") == [(7, None, None, "srun --label task id (confirmed by ranked lines)")]
    assert sorted(df.filter(pl.col("kind") == "watchdog_timeout")["rank"].to_list()) == \
        [r for r in range(12) if r != 7]


def test_slurm_output_per_task(tmp_path: Path) -> None:
    write(tmp_path / "job-4242-task0.out", [f"[rank0]:{WATCHDOG.format(r=0)}", PEER])
    write(tmp_path / "job-4242-task1.out", [f"[rank1]:{WATCHDOG.format(r=1)}", PEER])
    df = events(tmp_path)
    assert [r for r, *_ in who(df, "peer_closed")] == [0, 1]


def test_nccl_debug_file_per_process(tmp_path: Path) -> None:
    for r, (h, p) in enumerate([("gpu1", 4242), ("gpu1", 4243), ("gpu2", 5150)]):
        lines = [INIT.format(h=h, p=p, d=r % 2, r=r, n=3)]
        lines += [COLL.format(h=h, p=p, d=r % 2, i=i, n=3) for i in range(50)]
        if r == 2:
            lines.append(IB.format(h=h, p=p, d=0))
        write(tmp_path / "nccl" / f"{h}.{p}", lines)
    df = events(tmp_path)
    assert who(df, "network_error") == [(2, None, "gpu2", "launcher prefix mapped via [rankN] lines")]
    assert sorted(df.filter(pl.col("kind") == "nccl_comm_init")["rank"].to_list()) == [0, 1, 2]


def test_agent_failure_summary_names_the_process_of_another_file(tmp_path: Path) -> None:
    write(tmp_path / "agent.log", SUMMARY.format(host="gpu2.cluster", rank=5, lr=1,
                                                 pid=5150).splitlines())
    write(tmp_path / "nccl" / "gpu2.5150", [IB.format(h="gpu2", p=5150, d=1)])
    df = events(tmp_path)
    assert who(df, "elastic_failure") == [(5, 1, "gpu2.cluster", "torchelastic failure summary")]
    assert who(df, "network_error")[0][0] == 5


def test_pdsh_prefixed_output(tmp_path: Path) -> None:
    lines = [f"node{n}: loading model shard {i}" for i in range(4) for n in (1, 2)]
    lines += [f"node2: [rank3]:{WATCHDOG.format(r=3)}", f"node2: {PEER}"]
    df = events(write(tmp_path / "pdsh.log", lines))
    assert who(df, "watchdog_timeout") == [(3, None, "node2", "torch [rankN]: prefix")]
    assert who(df, "peer_closed")[0][2] == "node2"


def test_deepspeed_launcher_over_pdsh(tmp_path: Path) -> None:
    lines = [
        "worker-0: [2024-01-10 10:00:00,001] [INFO] [launch.py:146:main] WORLD INFO DICT: "
        "{'worker-0': [0, 1], 'worker-1': [0, 1]}",
        "worker-1: [2024-01-10 10:00:00,002] [INFO] [launch.py:256:main] process 7001 spawned "
        "with command: ['python', '-u', 'train.py', '--local_rank=1']",
        "worker-1: [2024-01-10 10:00:05,000] [INFO] [engine.py:88:step] [Rank 3] step=10 loss=2.1",
        *(f"worker-1: [rank3]: {x}" for x in OOM),
        "worker-1: [2024-01-10 10:00:06,000] [ERROR] [launch.py:321:sigkill_handler] ['python', "
        "'-u', 'train.py', '--local_rank=1'] exits with return code = 1",
    ]
    df = events(write(tmp_path / "deepspeed.log", lines))
    assert who(df, "oom") == [(3, None, "worker-1", "torch [rankN]: prefix")]


def test_accelerate_launch_failure_summary(tmp_path: Path) -> None:
    lines = ["The following values were not passed to `accelerate launch` and had defaults used "
             "instead:", "\t`--num_processes` was set to a value of `2`",
             *SUMMARY.format(host="box", rank=1, lr=1, pid=8123).splitlines(),
             "subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py']' returned "
             "non-zero exit status 1."]
    df = events(write(tmp_path / "accelerate.log", lines))
    assert who(df, "elastic_failure") == [(1, 1, "box", "torchelastic failure summary")]


def test_lightning_messages(tmp_path: Path) -> None:
    lines = ["initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/4", "[rank: 1] Seed set to 42",
             "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4"]
    df = events(write(tmp_path / "lightning.log", lines))
    assert who(df, "run_start") == [(1, None, None, "Lightning GLOBAL_RANK line"),
                                    (0, None, None, "Lightning GLOBAL_RANK line")]


# "worker-3" names a pod or node (PyTorchJob's master-0, worker-0...), not a rank.
@pytest.mark.parametrize("name, rank", [("rank3.log", 3), ("worker-3.txt", None),
                                        ("train_rank-12.out", 12), ("node-rank2.log", None)])
def test_plain_per_rank_files(tmp_path: Path, name: str, rank: int | None) -> None:
    df = events(write(tmp_path / name, OOM))
    assert [r for r, *_ in who(df, "oom")] == [rank]


def _compress(kind: str, data: bytes) -> bytes:
    if kind == "zst":
        return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True,
                              check=True).stdout
    return {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[kind](data)


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz", "zst"])
def test_compressed_logs(tmp_path: Path, kind: str) -> None:
    if kind == "zst" and not shutil.which("zstd"):
        pytest.skip("no zstd command")
    data = "\n".join([f"[rank2]: {x}" for x in OOM]).encode()
    (tmp_path / f"train.log.{kind}").write_bytes(_compress(kind, data))
    assert who(events(tmp_path), "oom")[0][0] == 2


def _tree(root: Path) -> dict[str, bytes]:
    return {
        "run/attempt_0/0/stderr.log": f"[rank0]:{WATCHDOG.format(r=0)}\n".encode(),
        "run/attempt_0/1/stderr.log": "\n".join([*(f"[rank1]: {x}" for x in OOM), PEER]).encode(),
    }


def _tar(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar of ``files`` (name -> content)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst", ".zip"])
def test_archives_read_in_place(tmp_path: Path, suffix: str) -> None:
    if suffix == ".tar.zst" and not shutil.which("zstd"):
        pytest.skip("no zstd command")
    archive = tmp_path / f"logs{suffix}"
    files = _tree(tmp_path)
    if suffix == ".zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    else:
        kind = suffix.removeprefix(".tar").removeprefix(".")
        archive.write_bytes(_compress(kind, _tar(files)) if kind else _tar(files))
    df = events(archive)
    assert who(df, "oom") == [(1, 1, None, "torch [rankN]: prefix")]
    assert who(df, "peer_closed")[0][:2] == (1, 1)
    assert df["source"].str.starts_with(f"{archive}!run/attempt_0/").all()


def test_archives_inside_a_directory_are_opened(tmp_path: Path) -> None:
    """A directory of archives (one per node, from colleagues): each is read as an archive,
    not as text — attribution from the member paths included."""
    files = _tree(tmp_path)
    d = tmp_path / "from-colleagues"
    d.mkdir()
    (d / "node1.tar").write_bytes(_tar(files))
    (d / "node2.tar.gz").write_bytes(gzip.compress(_tar(files)))
    with zipfile.ZipFile(d / "node3.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    write(d / "notes.txt", ["nothing here"])
    df = events(d)
    assert who(df, "oom") == [(1, 1, None, "torch [rankN]: prefix")] * 3
    logged = df.filter(pl.col("kind") != "last_line")  # notes.txt has a last line, no event
    assert sorted(logged["source"].str.extract(r"/(node\d\.\w+(?:\.gz)?)!", 1).unique()) == \
        ["node1.tar", "node2.tar.gz", "node3.zip"]
    assert not df["text"].str.contains("ustar|PK\x03\x04").any()


def test_zip_members_keep_their_time_and_hostile_names_are_noted(tmp_path: Path) -> None:
    """A zip member's stored date gives its year-less log lines their year; an absolute or
    '..' name is noted (read in place, never extracted), as for tar members."""
    archive = tmp_path / "old.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("rank1.log", date_time=(2024, 1, 2, 3, 4, 5))
        zf.writestr(info, f"[rank1]:{WATCHDOG.format(r=1).replace('E1218', 'E1231')}\n")
        zf.writestr("../../escape.log", "x\n")
        zf.writestr("/abs/rank2.log", "y\n")
    job = load([archive])
    ts = job.events.filter(pl.col("kind") == "watchdog_timeout")["ts"].to_list()
    assert [t.year for t in ts] == [2023]  # Dec 31 in a file written Jan 2 2024
    hostile = [n.path for n in job.notes if "never extracted" in n.message]
    assert sorted(hostile) == [f"{archive}!../../escape.log", f"{archive}!/abs/rank2.log"]


def test_many_members_of_a_compressed_tarball_are_read_in_two_passes(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for r in range(300):
            data = (f"rank {r} line\n" * 2000 + (PEER if r == 250 else "")).encode()
            info = tarfile.TarInfo(f"logs/rank{r}.log")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (tmp_path / "many.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    df = events(tmp_path / "many.tar.gz")
    assert who(df, "peer_closed") == [(250, None, None, "file name")]


# One node's directory or file names the host of every line in it that names none itself.
CASE = Path(__file__).parent / "rules" / "cases" / "RDZV002-node-directory"  # a real cell's lines


def test_unresolved_host_is_named_by_its_nodes_directory() -> None:
    """The fault matrix's unresolved_host 2x2 cell (node-1's /etc/hosts lacks node-0): only
    node-1's console holds the failed lookups, and only its directory says it is node-1's."""
    analysis = run(load([CASE / "node-0" / "console.log", CASE / "node-1" / "console.log"]))
    assert analysis.verdict is not None and analysis.verdict.rule == "RDZV002"
    assert analysis.verdict.hosts == ["node-1"]
    assert "node-0 does not resolve on node-1" in analysis.verdict.summary


@pytest.mark.parametrize("dirs", [("worker-0", "worker-1"), ("run-0", "run-1"),
                                  ("rank-0", "rank-1"), ("nodes", "hosts")])
def test_directories_that_name_no_node_give_no_host(tmp_path: Path, dirs: tuple[str, str]
                                                    ) -> None:
    """Near-miss: a pod (``worker-1``: its host name is ``<job>-worker-1``), a run, a rank or a
    plural is not a host: the same lines name no node."""
    inputs = [tmp_path / d / "console.log" for d in dirs]
    for node, path in zip(("node-0", "node-1"), inputs, strict=True):
        path.parent.mkdir()
        shutil.copy(CASE / node / "console.log", path)
    analysis = run(load(inputs))
    assert analysis.verdict is not None and analysis.verdict.rule == "RDZV002"
    assert analysis.verdict.hosts == []
    assert events(*inputs)["host"].drop_nulls().to_list() == []


@pytest.mark.parametrize("relpath, expect", [
    ("gpu-node07/attempt_0/1/stderr.log",
     (1, 1, "gpu-node07", "local rank on the only node the inputs show")),
    ("host-b/rank5.log", (5, None, "host-b", "file name")),
    ("slurm-4242-dgx-a07.out", (None, None, "dgx-a07", None)),
    ("node3.log", (None, None, "node3", None)),
    ("slurm-4242-task3.out", (None, None, None, None)),
])
def test_host_from_a_node_directory_or_file(tmp_path: Path, relpath: str,
                                            expect: tuple) -> None:
    df = events(write(tmp_path / relpath, OOM))
    assert who(df, "oom") == [expect]
