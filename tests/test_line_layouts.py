"""Real layouts read line by line: prefix stackings, terminal leftovers (ANSI, CRLF, ``\\r``-redrawn
progress bars), hard-wrapped messages, and each writer's last line.

Messages are copied from real logs (tests/corpus, shared/research); only prefixes are composed
around them, as the launchers named in each test write them.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table

from ddp_autopsy.analyzer import events as E
from ddp_autopsy.analyzer import timestamps as T
from ddp_autopsy.analyzer.attribution import resolve
from ddp_autopsy.analyzer.events import FileContext, scan_text
from ddp_autopsy.analyzer.job import FAILURE_KINDS, load
from ddp_autopsy.analyzer.lines import (
    NO_PREFIX,
    FilePrefix,
    detect,
    detect_prefixes,
    parse_line,
    segments,
)
from ddp_autopsy.rules.engine import run

# run-001 (torch 2.4, NCCL watchdog), llm-009 / eco-021 (OOM), llm-031 (a wrapped watchdog line)
WATCHDOG = ("[E726 13:23:24.941166255 ProcessGroupNCCL.cpp:616] [Rank 15] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1201955, OpType=ALLREDUCE, "
            "NumelIn=7020002, NumelOut=7020002, Timeout(ms)=1800000) ran for 1800066 milliseconds "
            "before timing out.")
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 132.00 MiB. GPU 3 has a "
       "total capacity of 79.10 GiB of which 98.00 MiB is free.")
WRAPPED = ["[rank1]:[E ProcessGroupNCCL.cpp:1182] [Rank 1] NCCL watchdog thread terminated with "
           "exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
           "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 6006",
           "59 milliseconds before timing out."]
# eco-011: a tqdm bar whose "\r" was lost in the paste, a rank's warning glued to it
GLUED = ("Tokenizing Prompts (num_proc=64):  92%|█████████▏| 328986/359152 [29:58<12:05, 41.59 "
         "examples/s][rank1]:[W516 14:34:56.853490829 socket.cpp:464] [c10d] waitForInput: poll "
         "for socket SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) returned "
         "0, likely a timeout")
BAR = "Map:  41%|████      | 4100/10000 [02:10<03:07, 31.4 ex/s]"  # issue #12


def scan(text: str, name: str = "train.log", **ctx) -> list[dict]:
    return scan_text(io.BytesIO(text.encode()), FileContext(name, 2026, **ctx), [])


def kinds(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r["kind"] == kind]


def data(row: dict) -> dict:
    return json.loads(row["data"]) if row["data"] else {}


# --- prefix stackings ----------------------------------------------------------------------------

def test_stamp_before_the_rank_prefix() -> None:
    info = parse_line(f"2024-11-20 14:37:16 [rank3]: {OOM}", 2024)  # eco-021, verbatim
    assert (info.rank, info.ts, info.clock, info.body) == (
        3, datetime(2024, 11, 20, 14, 37, 16), T.LOCAL, OOM)
    utc = parse_line(f"2024-05-01T12:00:01.123Z [rank3]:{WATCHDOG}", 2024)
    assert (utc.rank, utc.clock, utc.level) == (3, T.UTC, "E")
    assert utc.body.startswith("[Rank 15] Watchdog caught")
    # a platform console's stamp to the minute, after a blank (s11-001, verbatim prefix)
    minute = parse_line(f" 2025-02-18 12:54 [rank12]:{WATCHDOG}", 2025)
    assert (minute.rank, minute.ts) == (12, datetime(2025, 2, 18, 12, 54))


def test_srun_label_and_pdsh_host_vouched_for_by_the_next_prefix() -> None:
    info = parse_line(f"12: [rank12]:{WATCHDOG}", 2024)
    assert (info.task, info.rank, info.stream) == (12, 12, "t=12")
    info = parse_line(f"gpu-node3:  5: [default1]:[rank13]: {OOM}", 2024)
    assert (info.host, info.task, info.local_rank, info.rank, info.body) == (
        "gpu-node3", 5, 1, 13, OOM)
    # Alone, neither is read: "RuntimeError: x" is not a host, "3: x" may be a list item.
    assert parse_line("RuntimeError: Address already in use", 2024).host is None
    assert parse_line(f"3: {OOM}", 2024).task is None


def test_pdsh_hosts_that_are_addresses() -> None:
    lines = (Path(__file__).parent / "corpus/llm-022").glob("*.log")
    sample = next(iter(lines)).read_text().splitlines()
    prefix = detect_prefixes(sample)
    assert prefix.pdsh
    info = parse_line(sample[0], 2024, prefix)
    assert (info.stream, info.pid) == ("h=10.10.23.10", 1307367)


def test_a_logger_name_is_not_a_pdsh_host() -> None:
    # eco-030, the whole file: one line of Python logging.
    line = ("torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) "
            "local_rank: 0 (pid: 14447) of binary: /usr/bin/python")
    assert detect_prefixes([line]) == NO_PREFIX
    assert detect_prefixes(["node1.cluster.local: up"] * 3).pdsh


def test_kubectl_prefix() -> None:
    info = parse_line(f"[pod/trainer-worker-0/pytorch] [rank15]:{WATCHDOG}", 2024)
    assert (info.rank, info.host, info.stream) == (15, "trainer-worker-0",
                                                   "pod=trainer-worker-0/pytorch")
    assert info.body.startswith("[Rank 15] Watchdog")


def test_container_and_journal_envelopes_around_the_prefixes() -> None:
    # containerd/CRI-O (/var/log/pods), journalctl's default and short-iso outputs
    cri = parse_line(f"2026-11-25T03:00:01.123456789Z stderr F [default1]:[rank15]:{WATCHDOG}",
                     2026)
    assert (cri.rank, cri.local_rank) == (15, 1) and cri.body.startswith("[Rank 15] Watchdog")
    journal = parse_line(f"Nov  5 03:00:01 gpu-node-7 python[41235]: [rank15]:{WATCHDOG}", 2026)
    assert (journal.rank, journal.host, journal.pid) == (15, "gpu-node-7", None)
    assert journal.ts == datetime(2026, 11, 5, 3, 0, 1)
    iso = parse_line(f"2026-11-25T03:00:01+0000 gpu-node-7 python[41235]: [rank15]:{WATCHDOG}",
                     2026)
    assert (iso.rank, iso.host) == (15, "gpu-node-7")
    # a word and a colon after a stamp is a logger's, not a syslog tag: no [pid]
    plain = parse_line("2026-11-25 03:00:01 trainer main: step 5", 2026)
    assert plain.host is None


def _envelopes(console: list[str]) -> dict[str, str]:
    stamp = "2026-11-25T03:00:{:02d}.123456789Z"
    return {
        "plain": "".join(f"{line}\n" for line in console),
        "docker-json": "".join(json.dumps({"log": f"{line}\n", "stream": "stderr",
                                           "time": stamp.format(i)}, separators=(",", ":"))
                               + "\n" for i, line in enumerate(console)),
        "gcp-json": "".join(json.dumps({"insertId": f"i{i}", "textPayload": line,
                                        "timestamp": stamp.format(i), "severity": "ERROR"})
                            + "\n" for i, line in enumerate(console)),
        "loki-jsonl": "".join(json.dumps({"labels": {"job": "train"}, "line": line,
                                          "timestamp": stamp.format(i)}) + "\n"
                              for i, line in enumerate(console)),
        "journal-json": "".join(json.dumps({"MESSAGE": line, "_HOSTNAME": "node7"}) + "\n"
                                for line in console),
        "cri": "".join(f"{stamp.format(i)} stderr F {line}\n" for i, line in enumerate(console)),
        "ts-elapsed": "".join(f"00:00:{i:02d} {line}\n" for i, line in enumerate(console)),
        "sagemaker-mpi": "".join(f"[1,mpirank:{line[5]},algo-1]<stderr>:{line}\n"
                                 for line in console),
        "journal": "".join(f"Nov 25 03:00:{i:02d} node7 torchrun[812]: {line}\n"
                           for i, line in enumerate(console)),
    }


def test_one_console_in_each_envelope_gets_one_verdict(tmp_path: Path) -> None:
    console = ["[rank3]:Traceback (most recent call last):",
               '[rank3]:  File "/workspace/train.py", line 88, in <module>',
               "[rank3]:    loss.backward()",
               f"[rank3]:{OOM}",
               "[rank1]:" + WATCHDOG.replace("Rank 15", "Rank 1")]
    got = {}
    for name, text in _envelopes(console).items():
        (tmp_path / f"{name}.log").write_text(text)
        analysis = run(load([tmp_path / f"{name}.log"]))
        got[name] = (analysis.verdict.cause, tuple(analysis.verdict.ranks))
        if name.endswith("json") or name.endswith("jsonl"):
            assert any("field read" in n.message for n in analysis.job.notes), name
    assert set(got.values()) == {("out_of_memory", (3,))}, got
    # the evidence is the line as the program wrote it, at its line number in the file
    ev = run(load([tmp_path / "docker-json.log"])).verdict.evidence[0]
    assert ev.line == 4 and ev.text == f"2026-11-25T03:00:03.123456789Z [rank3]:{OOM}"


def _hard_wrap(lines: list[str], width: int) -> str:
    return "".join("".join(line[i:i + width] + "\n" for i in range(0, max(len(line), 1), width))
                   for line in lines)


def test_a_console_hard_wrapped_by_a_terminal_is_read_whole(tmp_path: Path) -> None:
    """tmux capture-pane, a terminal's copy: every line cut at the pane's width, no prefix on
    the rest of it. Read whole again, the verdict is the unwrapped console's."""
    console = [f"[rank{r}]:" + WATCHDOG.replace("Rank 15", f"Rank {r}") for r in (1, 2, 3)]
    console += ["[rank0]:Traceback (most recent call last):",
                '[rank0]:  File "/workspace/train.py", line 88, in <module>',
                "[rank0]:    loss.backward()", f"[rank0]:{OOM}"] * 2
    console += [f" iteration {n:>8}/  500000 | consumed samples: {n * 2048:>12} | elapsed time "
                f"per iteration (ms): {105160 + n * 7}.4 | learning rate: 4.475E-05 | lm loss: "
                f"{2.1 - n / 100:.6E} |" for n in range(8)]
    verdicts = {}
    for width in (None, 80, 120):
        text = "".join(f"{line}\n" for line in console) if width is None else \
            _hard_wrap(console, width)
        (tmp_path / f"w{width}.log").write_text(text)
        assert E.wrap_width(text.encode()) == width
        analysis = run(load([tmp_path / f"w{width}.log"]))
        verdicts[width] = (analysis.verdict.cause, tuple(analysis.verdict.ranks))
        if width:
            assert any(f"hard-wrapped at {width}" in n.message for n in analysis.job.notes)
    assert set(verdicts.values()) == {("out_of_memory", (0,))}, verdicts


def test_lines_of_one_width_that_end_there_are_no_wrap() -> None:
    # nccl-tests' table (right-aligned rows), one message repeated, rich's box, padded lines
    rows = [f"{2 ** n:>12}{2 ** n // 4:>14}     float     sum      -1{n * 37.3:>9.1f}"
            f"{n * 1.1:>7.2f}{n * 2.2:>7.2f}      0{n * 37.1:>9.1f}" for n in range(20)]
    assert len({len(r) for r in rows}) == 1
    assert E.wrap_width("\n".join(rows).encode()) is None
    same = "BFD: DWARF error: section .debug_info is larger than its filesize! (0x93ef57 vs 0x5)"
    assert E.wrap_width(("\n".join([same, "x"] * 12)).encode()) is None
    box = ["│ " + f"line {n}".ljust(76) + " │" for n in range(20)]
    assert E.wrap_width("\n".join(box).encode()) is None
    padded = [f"[rank0]: message {n}".ljust(80) for n in range(20)]
    assert E.wrap_width("\n".join(padded).encode()) is None
    # one print template, every row as wide (a review's repro): rows, not a wrap
    rows = [f"rank {n % 4} | epoch 3 | step {n:06d}/010000 | loss {1 + n / 1000:.4f} | "
            f"lr 2.000e-05 | mem_reserved 61.07GB | data_time 0.0123" for n in range(40)]
    assert len({len(r) for r in rows}) == 1
    assert E.wrap_width("\n".join(rows).encode()) is None


def _pasted(console: list[str]) -> dict[str, str]:
    typo = str.maketrans({" ": "\u00a0", '"': "\u201d", "'": "\u2019"})
    return {
        "plain": "".join(f"{line}\n" for line in console),
        "cat-n": "".join(f"{n:>6}\t{line}\n" for n, line in enumerate(console, 1)),
        "less-N": "".join(f"{n:>7} {line}".rstrip() + "\n" for n, line in enumerate(console, 1)),
        "web-page": "".join(f"{line.translate(typo)}\u200b\n" for line in console),
        "entities": "".join(line.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
                            + "\n" for line in console),
        "markdown-indent": "I get this on 2 nodes:\n\n" + "".join(f"    {line}\n" for line in console),
    }


def test_one_console_copied_through_pages_editors_and_pagers_gets_one_verdict(
        tmp_path: Path) -> None:
    console = ["[rank3]:Traceback (most recent call last):",
               '[rank3]:  File "/workspace/train.py", line 88, in <module>',
               "[rank3]:    main()", '[rank3]:  File "/workspace/train.py", line 61, in main',
               "[rank3]:    loss.backward()", f"[rank3]:{OOM}",
               "[rank1]:" + WATCHDOG.replace("Rank 15", "Rank 1")]
    got = {}
    for name, text in _pasted(console).items():
        (tmp_path / f"{name}.log").write_text(text)
        analysis = run(load([tmp_path / f"{name}.log"]))
        got[name] = (analysis.verdict.cause, tuple(analysis.verdict.ranks),
                     "in main" in analysis.verdict.summary or "main" in str(
                         analysis.verdict.details.get("frame")))
        if name != "plain":
            assert any("copied through" in n.message for n in analysis.job.notes), name
    assert set(got.values()) == {got["plain"]} and got["plain"][:2] == ("out_of_memory", (3,)), got


def test_a_log_of_its_own_is_not_taken_for_a_paste() -> None:
    traceback = ["Traceback (most recent call last):", '  File "/w/train.py", line 8, in <module>',
                 "    main()", '  File "/w/train.py", line 5, in main', "    step()",
                 '  File "/w/train.py", line 3, in step', "    raise ValueError(1)"]
    assert E.paste_fixes("\n".join(traceback).encode()) is None
    pyspy = ["Thread 700 (idle): \"MainThread\"", "    all_reduce (torch/distributed/c10d.py:3)",
             "    main (train.py:33)", "    <module> (train.py:40)", "    x (y.py:1)"]
    assert E.paste_fixes("\n".join(pyspy).encode()) is None
    sizes = [f"{2 ** n:>12}{2 ** n // 4:>14}     float     sum" for n in range(3, 20)]
    assert E.paste_fixes("\n".join(sizes).encode()) is None


def test_docker_compose_prefix_decided_per_file() -> None:
    lines = [f"trainer-{n}  | [rank{n}]:{WATCHDOG}" for n in (1, 2)] * 4
    prefix = detect_prefixes(lines)
    assert prefix == FilePrefix(compose=True)
    info = parse_line(lines[1], 2024, prefix)
    assert (info.host, info.rank, info.stream) == ("trainer-2", 2, "svc=trainer-2")
    # A Markdown table is no compose file (shared/corpus/README.md).
    table = ["| field | meaning |", "| `source` | the issue thread |",
             "| `evidence` | the line(s) that prove it |"]
    assert detect_prefixes(table) == NO_PREFIX


def test_ray_prefixes_name_a_worker_not_a_rank() -> None:
    # llm-028 and llm-020, verbatim
    old = parse_line("(pid=909608) z-pc:909608:910337 [0] transport/p2p.cc:238 NCCL WARN failed "
                     "to open CUDA IPC handle : 217 peer access is not supported between these "
                     "two devices", 2021)
    assert (old.rank, old.pid, old.host, old.stream) == (None, 909608, "z-pc", "w=909608")
    new = parse_line("(MegatronPolicyWorker pid=1391870) [2026-07-10 06:19:36] pool0-00008:1391870:"
                     "1393239 [7] init.cc:904 NCCL WARN Duplicate GPU detected : rank 15 and rank "
                     "7 both on CUDA device e4000", 2026)
    assert (new.rank, new.pid, new.ts) == (None, 1391870, datetime(2026, 7, 10, 6, 19, 36))
    train = parse_line(f"(RayTrainWorker pid=2372, ip=10.0.1.5) [rank3]: {OOM}", 2026)
    assert (train.rank, train.pid, train.host, train.stream, train.body) == (
        3, 2372, "10.0.1.5", "w=2372@10.0.1.5", OOM)


def test_a_time_of_day_before_ray_and_rank_prefixes() -> None:
    # s14-021: a log viewer's time of day, then the Ray actor, then torch's rank prefix
    info = parse_line(f"11:31:42.990 (WorkerDict pid=10872) [rank5]:{WATCHDOG}", 2025)
    assert (info.rank, info.pid) == (5, 10872) and info.body.startswith("[Rank 15] Watchdog")
    # moreutils' ts: "ts -s" elapsed time, its default "%b %d %H:%M:%S"; syslog needs "ident[pid]:"
    assert parse_line("00:01:17 loss=2.1", 2025).body == "loss=2.1"
    assert parse_line("Nov 25 01:17:16 rank 1: uploading", 2025).body == "rank 1: uploading"
    info = parse_line("Nov 25 01:17:16 INFO root: step 5", 2025)
    assert (info.host, info.body) == (None, "INFO root: step 5")


def test_determined_trial_log_prefix() -> None:
    # a Determined trial's log as its CLI and web UI give it (stamp, container id, rank)
    info = parse_line(f"[2024-03-15T16:29:06.552162Z] 5c902731 [rank=3] || [rank3]:{OOM}", 2024)
    assert (info.rank, info.body) == (3, OOM)
    agent = parse_line("[2024-03-15T16:29:04.032670Z] 5c902731 || 2024-03-15 16:29:04,032: "
                       "DEBUG: gpu_idle_timeout", 2024)
    assert agent.rank is None and agent.body.startswith("2024-03-15 16:29:04,032: DEBUG")


def test_loki_logcli_label_set_after_the_stamp() -> None:
    info = parse_line('2026-11-25T01:20:03Z {container="pytorch", pod="ddp-job-worker-1"} '
                      f"[rank3]:{OOM}", 2026)
    assert (info.rank, info.body) == (3, OOM)


def test_sagemaker_mpirun_tag() -> None:
    info = parse_line(f"[1,mpirank:3,algo-2]<stderr>:{OOM}", 2025)
    assert (info.rank, info.host, info.body) == (3, "algo-2", OOM)


def test_vllm_worker_prefix_and_level_first_logger() -> None:
    """vLLM's multiprocessing workers: "(VllmWorker rank=1 pid=4888) INFO 07-08 10:09:09
    [utils.py:1126] msg"; its engine core logs "ERROR 07-08 10:09:09 [core.py:583] msg"."""
    worker = parse_line("(VllmWorker rank=1 pid=4888) INFO 07-08 10:09:09 [utils.py:1126] "
                        "Found nccl from library libnccl.so.2", 2025)
    assert (worker.rank, worker.pid, worker.level, worker.ts, worker.body) == (
        1, 4888, "I", datetime(2025, 7, 8, 10, 9, 9), "Found nccl from library libnccl.so.2")
    core = parse_line("ERROR 07-08 10:09:09 [core.py:583] RuntimeError: Worker failed", 2025)
    assert (core.rank, core.level, core.body) == (None, "E", "RuntimeError: Worker failed")
    # Ray's own prefix names a process, not a rank
    assert parse_line("(RayWorkerWrapper pid=1978, ip=10.41.0.8) msg", 2025).rank is None


def test_glog_with_and_without_a_rank_prefix() -> None:
    run001 = f"[rank15]:{WATCHDOG}"
    run003 = ("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
              "WorkNCCL(SeqNum=3742816, OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for "
              "1801750 milliseconds before timing out.")
    rows = kinds(scan(f"{run001}\n{run003}\n"), "watchdog_timeout")
    assert [(r["rank"], r["level"], data(r)["seq"]) for r in rows] == [(15, "E", 1201955),
                                                                     (1, "E", 3742816)]


def test_python_logging_formats() -> None:
    pt015 = parse_line("2022-05-09 22:30:27,597 INFO Waiting in store based barrier to initialize "
                       "process group for rank: 0, key: store_based_barrier_key:1 (world_size=6, "
                       "worker_count=287, timeout=0:30:00)", 2022)
    assert (pt015.level, pt015.body[:27]) == ("I", "Waiting in store based barr")
    dashed = parse_line(f"2024-05-01 12:00:01,123 - ERROR - {OOM}", 2024)
    assert (dashed.level, dashed.body, dashed.ts.microsecond) == ("E", OOM, 123000)
    deepspeed = parse_line("[2023-07-04 17:31:27,755] [INFO] [launch.py:315:sigkill_handler] "
                           "Killing subprocess 953850", 2023)  # eco-012
    assert (deepspeed.level, deepspeed.body) == ("I", "Killing subprocess 953850")
    plain = parse_line("INFO:mlpf:Saved predictions at experiments/test_pyg-clic_20250124_032654"
                       "_637048/preds_epoch_1/clic_edm_ttbar_pf/pred_0_0.parquet", 2025)  # run-006
    assert (plain.level, plain.body[:17]) == ("I", "Saved predictions")
    upper = parse_line("[RANK 4] 2026-05-19 10:10:29,604 [ERROR] GPU circuit breaker OPEN: "
                       "cuda_error", 2026)  # llm-015
    assert (upper.rank, upper.cue, upper.level) == (4, "[RANK N] prefix", "E")
    # Still classified: pt-001's torchelastic line behind "WARNING:<logger>:"
    rows = scan("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 102241 "
                "closing signal SIGHUP\n")
    assert [r["kind"] for r in rows] == ["closing_signal", "last_line"]


# --- what a terminal leaves ---------------------------------------------------------------------

def test_icefall_rank_of_world_logger_prefix() -> None:
    """s70-005 (vall-e, icefall's setup_logger): "[file.py:N] (rank/world) msg"."""
    info = parse_line("2023-04-13 16:00:05,621 INFO [trainer.py:650] (5/8) Reaches end of "
                      "dataloader.", 2023)
    assert (info.rank, info.cue, info.body) == (5, "(rank/world) logger prefix",
                                                "Reaches end of dataloader.")
    assert parse_line("INFO [trainer.py:650] (9/8) x", 2023).rank is None


def test_ansi_colours_are_stripped_before_matching() -> None:
    coloured = f"\x1b[31m[rank15]:\x1b[0m\x1b[1m{WATCHDOG}\x1b[0m\n"
    (row,) = kinds(scan(coloured), "watchdog_timeout")
    assert (row["rank"], row["text"]) == (15, f"[rank15]:{WATCHDOG}")
    assert parse_line("\x1b[32m[rank2]:\x1b[0m ok", 2024).rank == 2


def test_crlf_reads_like_lf() -> None:
    lines = [f"[rank15]:{WATCHDOG}", f"[rank3]: {OOM}", "[rank3]: done"]
    assert scan("\r\n".join(lines) + "\r\n") == scan("\n".join(lines) + "\n")


def test_a_message_glued_to_a_progress_bar_is_read_on_its_own() -> None:
    bars = "\r".join(f"[rank0]:{BAR.replace('41%', f'{p}%')}" for p in (40, 41))
    text = f"starting\n{bars}\r[rank3]: {OOM}\r[rank0]:{BAR}\n"
    rows = scan(text)
    (oom,) = kinds(rows, "oom")
    assert (oom["rank"], oom["line"], oom["text"]) == (3, 2, f"[rank3]: {OOM}")
    last = {r["rank"]: (r["line"], r["text"], data(r)) for r in kinds(rows, "last_line")}
    assert last[0] == (2, f"[rank0]:{BAR}", {"progress": True})
    assert last[3] == (2, f"[rank3]: {OOM}", {"progress": False})
    assert last[None] == (1, "starting", {"progress": False})


def test_a_paste_that_lost_the_carriage_return() -> None:
    rows = scan(GLUED + "\n")
    last = {r["rank"]: r["text"] for r in kinds(rows, "last_line")}
    assert last[1].startswith("[rank1]:[W516 14:34:56.853490829 socket.cpp:464]")
    assert last[None].endswith("41.59 examples/s]")


# --- hard-wrapped messages ----------------------------------------------------------------------

def test_a_wrapped_message_is_joined() -> None:
    rows = scan("\n".join([*WRAPPED, "next"]) + "\n")
    (row,) = kinds(rows, "watchdog_timeout")
    assert (row["rank"], row["line"]) == (1, 1)
    assert (data(row)["ran_ms"], data(row)["joined_lines"]) == (600659, 2)
    assert row["text"].endswith("ran for 600659 milliseconds before timing out.")
    assert [r["line"] for r in kinds(rows, "last_line")] == [1, 3]  # line 2 is rank 1's


def test_a_wrap_at_a_space_is_joined_with_one() -> None:
    first, rest = WATCHDOG.split(" NumelOut=")
    (row,) = kinds(scan(f"[rank15]:{first}\nNumelOut={rest}\n"), "watchdog_timeout")
    assert (data(row)["nout"], data(row)["ran_ms"]) == (7020002, 1800066)


def test_a_paste_that_starts_at_worknccl_is_joined_with_its_ran_for() -> None:
    """A paste cut before "Watchdog caught ..." and wrapped before "ran for": its two lines are
    one timeout."""
    rows = scan("WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)\n"
                "  ran for 721595 milliseconds before timing out\n")
    (row,) = kinds(rows, "watchdog_timeout")
    assert (data(row)["seq"], data(row)["op"], data(row)["ran_ms"]) == (1, "ALLREDUCE", 721595)


def test_a_mismatch_report_wrapped_after_its_first_sentence_is_joined() -> None:
    rows = scan("RuntimeError: Detected mismatch between collectives on ranks. \n"
                "Rank 7 is running collective: CollectiveFingerPrint(SequenceNumber=18, "
                "OpType=BROADCAST, ...)\n"
                "but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=30, "
                "OpType=BROADCAST, ...)\n")
    (row,) = kinds(rows, "collective_fingerprint_mismatch")
    assert (data(row)["r1"], data(row)["r2"], data(row)["joined_lines"]) == (7, 0, 3)


def test_a_gloo_connect_wrapped_before_its_address_is_joined() -> None:
    """s68-001: the paste wraps old Gloo's connect failure after "connect "."""
    rows = scan("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect \n"
                "[127.0.1.1]:29591: Connection refused\n")
    (gloo,) = kinds(rows, "gloo_connect_failure")
    assert (data(gloo)["addr"], data(gloo)["port"]) == ("127.0.1.1", 29591)


def test_joins_stop_at_a_prefixed_line_and_after_three_lines() -> None:
    assert not kinds(scan(f"{WRAPPED[0]}\n[rank1]:{WRAPPED[1]}\n"), "watchdog_timeout")
    head, tail = WRAPPED[0][:-30], WRAPPED[0][-30:]
    three = scan(f"{head}\n{tail}\n{WRAPPED[1]}\n")
    assert data(kinds(three, "watchdog_timeout")[0])["joined_lines"] == 3
    four = scan(f"{head}\n{tail[:15]}\n{tail[15:]}\n{WRAPPED[1]}\n")
    # not joined over four lines: at most the first line's cut form, with its sequence only
    assert all("ran_ms" not in data(r) and "joined_lines" not in data(r)
               for r in kinds(four, "watchdog_timeout"))


# --- each writer's last line --------------------------------------------------------------------

def test_each_ranks_last_line_after_attribution(tmp_path: Path) -> None:
    lines = [f"[default0]:[rank0]:{WATCHDOG}", "[default1]:[rank1]: starting epoch 0",
             f"[default1]:{BAR}", f"[default0]:[rank0]: {OOM}", "[default0]:", ""]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    df = resolve(load([tmp_path]).events).filter(pl.col("kind") == "last_line")
    got = sorted((r["rank"], r["line"], r["text"], data(r)["progress"])
                 for r in df.iter_rows(named=True))
    assert got == [(0, 4, f"[default0]:[rank0]: {OOM}", False),
                   (1, 2, "[default1]:[rank1]: starting epoch 0", False),
                   (1, 3, f"[default1]:{BAR}", True)]


def test_unprefixed_lines_that_open_with_their_rank_are_each_ranks_last(tmp_path: Path) -> None:
    # mp.spawn's console: no prefixes, but the program names its rank at the start of its lines
    lines = ["rank=0 step=2 sum=12.0", "rank 1: uploading shard step2-rank1.pt",
             "rank=2 step=2 sum=12.0", "Rank 0 is the problematic rank", "all done"]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    df = resolve(load([tmp_path]).events).filter(pl.col("kind") == "last_line")
    got = sorted(((r["rank"], r["text"]) for r in df.iter_rows(named=True)),
                 key=lambda x: (x[0] is None, x))
    # "Rank 0 is ..." reports on rank 0 rather than speaking for it; the unranked last line stays
    assert got == [(0, "rank=0 step=2 sum=12.0"), (1, "rank 1: uploading shard step2-rank1.pt"),
                   (2, "rank=2 step=2 sum=12.0"), (None, "all done")]


def test_lines_that_open_with_their_rank_after_a_stamp_are_each_ranks_last(
        tmp_path: Path) -> None:
    # the same console through Python logging's "%(asctime)s %(levelname)s %(message)s", and
    # through moreutils' ts
    lines = ["rank=0 step=2 sum=12.0", "rank 1: uploading shard step2-rank1.pt",
             "rank=2 step=2 sum=12.0", "all done"]
    for name, stamp in (("logging", "2026-11-25 03:00:01,123 INFO "), ("ts", "Nov 25 03:00:01 "),
                        ("ts-s", "00:00:07 ")):
        (tmp_path / f"{name}.log").write_text("".join(f"{stamp}{line}\n" for line in lines))
        df = resolve(load([tmp_path / f"{name}.log"]).events).filter(pl.col("kind") == "last_line")
        got = sorted((r["rank"] for r in df.iter_rows(named=True)),
                     key=lambda x: (x is None, x))
        assert got == [0, 1, 2, None], name


def test_a_writer_that_went_quiet_blocks_ago(monkeypatch) -> None:
    """Its last line is found though later blocks never name it (and blocks are pooled)."""
    monkeypatch.setattr(E, "BLOCK_BYTES", 1 << 12)
    lines = [f"{r:>2}: [rank{r}]: step {i}" for i in range(40) for r in range(4)]
    lines.insert(5, f" 3: {BAR}")
    lines = [x for x in lines if not (x.startswith(" 3:") and "step" in x and int(x[-2:]) > 1)]
    lines += [f" {r}: [rank{r}]: step {i}" for i in range(40, 400) for r in range(3)]
    rows = scan("\n".join(lines) + "\n", "slurm-1.out")
    last = {r["stream"]: (r["line"], r["text"]) for r in kinds(rows, "last_line")}
    assert last["t=3"] == (lines.index(" 3: [rank3]: step 1") + 1, " 3: [rank3]: step 1")
    assert last["t=2"] == (len(lines), " 2: [rank2]: step 399")


def test_many_unprefixed_lines_in_a_prefixed_file(monkeypatch) -> None:
    """More names than QUICK_TAILS by their first characters: the exact prefixes decide."""
    monkeypatch.setattr(E, "QUICK_TAILS", 4)
    lines = [f"[rank{r}]: step {r}" for r in range(3)] + [f"{i} {OOM}" for i in range(20)]
    text = "\n".join(lines) + "\n"
    frame, _ = E._lines(text.encode())
    _, writers = detect(lines)
    assert [t[0] for t in E._tails(frame, writers)] == [0, 1, 2, 22]  # one per writer
    last = {r["rank"]: r["line"] for r in kinds(scan(text), "last_line")}
    assert last == {0: 1, 1: 2, 2: 3, None: 23}


def test_last_lines_are_no_failure() -> None:
    assert "last_line" not in FAILURE_KINDS
    healthy = "\n".join(f"[default{r}]:[rank{r}]:{BAR}" for r in range(4))
    rows = scan(healthy + "\n")
    assert {r["kind"] for r in rows} == {"last_line"}


def test_a_healthy_log_has_no_verdict(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("\n".join(f"[rank{r}]:{BAR}" for r in range(4)) + "\n")
    assert run(load([tmp_path])).verdict is None


def test_a_log_quoted_in_a_bug_report() -> None:
    """eco-004: a whole log pasted as a Markdown quote."""
    lines = (Path(__file__).parent / "corpus/eco-004/worker.log").read_text().splitlines()
    prefix = detect_prefixes(lines)
    assert prefix == FilePrefix(quote=True)
    rows = scan("\n".join(lines) + "\n")
    (exc,) = kinds(rows, "exception")
    assert (data(exc)["type"], exc["text"]) == ("ValueError", lines[-1])
    assert parse_line("> [rank1]: x", 2024, prefix).rank == 1


def test_a_line_of_many_redraws() -> None:
    """A bar redrawn 20,000 times on one physical line: its last state is the writer's."""
    redraws = "\r".join(f"[rank0]:{BAR.replace('41%', f'{p % 100}%')}" for p in range(20_000))
    rows = scan(f"{redraws}\n[rank1]: {OOM}\n")
    last = {r["rank"]: (r["line"], r["text"], data(r)) for r in kinds(rows, "last_line")}
    assert last[0] == (1, f"[rank0]:{BAR.replace('41%', '99%')}", {"progress": True})
    assert segments("a\rb\rc", 2) == ["b", "c"] and segments("a\rb", 5) == ["a", "b"]


# --- rich's boxed tracebacks and pytest's failure report ------------------------------------------

# A module deep enough for rich to wrap its frame header inside the box (80 columns).
DEEP = "site-packages/torch/distributed/fully_sharded_data_parallel_wrappers"
RAISER = '''class OutOfMemoryError(RuntimeError):
    pass


def _wrap(module):
    if module:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB "
                               "total capacity; 78.50 GiB already allocated)")
    return module
'''
MAIN = f'''import sys
sys.path.insert(0, {DEEP!r})
from rich.traceback import install
install()
import wrap_policy_module


def main():
    for i in range(2):
        wrap_policy_module._wrap(i)


main()
'''


def rich_traceback(tmp_path: Path) -> list[str]:
    """What rich.traceback.install() prints for an uncaught exception, from a real process."""
    (tmp_path / DEEP).mkdir(parents=True)
    (tmp_path / DEEP / "wrap_policy_module.py").write_text(RAISER)
    (tmp_path / "train.py").write_text(MAIN)
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 1 and "╭" in out.stderr, out.stderr
    return out.stderr.splitlines()


def test_rich_boxed_traceback_is_read_as_a_traceback(tmp_path: Path) -> None:
    lines = rich_traceback(tmp_path)
    module = str(tmp_path / DEEP / "wrap_policy_module.py")
    # The last frame's header is wrapped inside the box.
    assert not any(f"{module}:7 in _wrap" in x for x in lines)
    # torchrun --tee's prefixes in front of every line, as it writes them.
    rows = scan("".join(f"[default1]:[rank3]:{x}\n" for x in lines))
    (exc,) = kinds(rows, "exception")
    assert data(exc)["type"] == "OutOfMemoryError" and exc["rank"] == 3
    assert data(exc)["frame"] == {"file": module, "line": 7, "func": "_wrap"}
    assert [r["line"] for r in kinds(rows, "traceback")] == [1]
    # The source line rich shows ("❱ 7 │ raise OutOfMemoryError("CUDA out of memory...") is no
    # event: only the exception line after the box is.
    assert {r["line"] for r in kinds(rows, "oom")} == {exc["line"]}
    assert not kinds(rows, "traceback_fragment")


def test_a_rich_box_cut_before_its_exception_is_still_a_failure(tmp_path: Path) -> None:
    """s6-027: the paste starts inside the box and stops before the exception line."""
    case = Path(__file__).parent / "corpus/s6-027/train.log"
    rows = scan(case.read_text())
    (frag,) = kinds(rows, "traceback_fragment")
    assert data(frag)["frame"]["file"].endswith("torch/distributed/fsdp/wrap.py")
    assert (data(frag)["frame"]["line"], data(frag)["frame"]["func"], frag["line"]) == (
        317, "_wrap", 8)  # the header wrapped over lines 8-9
    # The same from a real box: every line after the last frame's header dropped.
    lines = rich_traceback(tmp_path)
    last = max(i for i, x in enumerate(lines) if " in _wrap" in x)
    (frag,) = kinds(scan("\n".join(lines[3: last + 3]) + "\n"), "traceback_fragment")
    assert data(frag)["frame"]["func"] == "_wrap"
    (tmp_path / "case").mkdir()
    (tmp_path / "case/train.log").write_text(case.read_text())
    verdict = run(load([tmp_path / "case"])).verdict
    # (a process raised there, its exception line cut: CRASH001's cut traceback, innermost
    # frame quoted)
    assert verdict is not None and verdict.rule == "CRASH001"
    assert verdict.details.get("cut") and verdict.details["frame"]["func"] == "_wrap"


def test_frames_through_torch_distributed_without_header_or_exception() -> None:
    """s25-014: the paste keeps only a launcher traceback's frames (Windows paths): torch's
    launcher prints frames only when it fails. A user's printed stack stays no failure."""
    frames = ('  File "D:\\py\\Lib\\site-packages\\torch\\distributed\\run.py", line 927, in run\n'
              "    elastic_launch(\n"
              '  File "D:\\py\\Lib\\site-packages\\torch\\distributed\\elastic\\agent\\'
              'server\\api.py", line 875, in _invoke_run\n'
              "    self._initialize_workers(self._worker_group)\n"
              "             ^^^^^^^^^^^^^^^^^^\n")
    (frag,) = kinds(scan(frames), "traceback_fragment")
    assert data(frag)["frame"]["func"] == "_invoke_run" and frag["line"] == 3
    printed = '  File "/home/me/train.py", line 12, in main\n    step()\n' \
              '  File "/home/me/train.py", line 30, in step\n    log_stack()\n'
    assert not kinds(scan(printed), "traceback_fragment")


def test_a_traceback_cut_right_after_its_header_glued_to_a_bar() -> None:
    """s14-027: the paste stops at the header, glued to the tokenizer's bar."""
    bar = "Running tokenizer on dataset:  38%|███▊      | 32068/85249 [32:13<53:59, 16.42ba/s]"
    (frag,) = kinds(scan(f"{bar}\n{bar}Traceback (most recent call last):\n"),
                    "traceback_fragment")
    assert (frag["line"], data(frag)["frame"]) == (2, None)
    # a complete traceback is no fragment
    whole = "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nValueError: x\n"
    assert not kinds(scan(whole), "traceback_fragment")


def test_a_failure_summary_entry_pasted_without_its_headers() -> None:
    """s5-020: only the entry's fields, from "rank" on (no "Root Cause", no "[0]:")."""
    rows = scan("  rank      : 0 (local_rank: 0)\n  exitcode  : -11 (pid: 6421)\n"
                "  error_file: <N/A>\n  traceback : Signal 11 (SIGSEGV) received by PID 6421\n")
    (entry,) = kinds(rows, "elastic_failure")
    assert (data(entry)["rank"], data(entry)["exitcode"], data(entry)["root"]) == (0, -11, True)
    # a "rank : N" line that is no summary's stays what it is
    assert not kinds(scan("  rank      : 3\n"), "elastic_failure")


def test_a_rich_table_is_no_traceback() -> None:
    """Lightning's model summary: a rich table's rows are box lines, not a traceback."""
    console = Console(file=io.StringIO(), width=80)
    table = Table("", "Name", "Type", "Params")
    table.add_row("0", "model", "Linear", "1.2 K")
    table.add_row("1", "loss", "CrossEntropyLoss", "0")
    console.print(table)
    text = console.file.getvalue()
    assert "│ 0 │ model" in text
    rows = scan(text)
    assert not [r for r in rows if r["kind"] != "last_line"]


def test_pytest_failure_report_is_read_as_its_content(tmp_path: Path) -> None:
    """pytest's "E" lines, from a real pytest run: the exception and its message's events."""
    (tmp_path / "test_job.py").write_text(
        "def test_allreduce():\n"
        f"    raise RuntimeError({WATCHDOG!r})\n\n\n"
        "def test_nested():\n"
        "    for _ in range(1):\n"
        "        if True:\n"
        f"            raise ValueError({OOM!r})\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "test_job.py"], cwd=tmp_path, text=True, capture_output=True,
                         timeout=120)
    assert "FAILED" in out.stdout, out.stdout
    lines = out.stdout.splitlines()
    prefix = detect_prefixes(lines)
    assert prefix.pytest == 7, prefix  # "E" + 7 spaces (the deeper one has 11)
    rows = scan(out.stdout)
    assert {data(r)["type"] for r in kinds(rows, "exception")} == {"RuntimeError", "ValueError"}
    # (pytest's "> raise ..." source line holds the message too: read as before, unprefixed)
    for kind in ("watchdog_timeout", "oom"):
        (row,) = [r for r in kinds(rows, kind) if lines[r["line"] - 1].startswith("E ")]
        assert row["text"] == lines[row["line"] - 1]
    # s6-020: a traceback in the report, cut before its exception line.
    case = (Path(__file__).parent / "corpus/s6-020/pytest.log").read_text()
    rows = scan(case)
    assert [r["line"] for r in kinds(rows, "traceback")] == [4]
    (frag,) = kinds(rows, "traceback_fragment")
    assert data(frag)["frame"]["file"].endswith("torch/utils/data/dataloader.py")


def test_rich_frame_header_wrapped_inside_its_line_number() -> None:
    """rich 15 wraps a long header at any character: "...module.py:" then "7 in _wrap" (which
    is no numbered code line)."""
    header = "/very/long/path/site-packages/torch/distributed/fsdp/wrap_policy_modules.py:7 in _wrap"
    width = (header.index(":7 ") + 1) // 2  # two full lines, then "7 in _wrap"
    pieces = [header[i:i + width] for i in range(0, len(header), width)]
    body = [*pieces, "", '❱  7 │   │   raise OutOfMemoryError("CUDA out of memory")']
    box = ["╭" + " Traceback (most recent call last) ".center(width + 2, "─") + "╮",
           *(f"│ {x.ljust(width)} │" for x in body), "╰" + "─" * (width + 2) + "╯",
           "OutOfMemoryError: CUDA out of memory."]
    assert box[2].endswith(".py: │") and box[3].startswith("│ 7 in _wrap ")
    (exc,) = kinds(scan("".join(f"{x}\n" for x in box)), "exception")
    assert data(exc)["frame"] == {"file": header.split(":")[0], "line": 7, "func": "_wrap"}
