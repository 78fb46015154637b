"""Line prefixes: per line (launchers, torch, loggers, NCCL) and per file (pdsh, srun, [N]:)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_autopsy.analyzer.lines import (
    NO_PREFIX,
    FilePrefix,
    detect_prefixes,
    has_box,
    parse_line,
    segments,
    unbox,
)

ALL = FilePrefix(pdsh=True, srun=True, bracket=True, pytest=7)


def test_stacked_launcher_torch_and_c10_prefixes() -> None:
    info = parse_line("[default1]:[rank3]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] "
                      "[PG ID 0 PG GUID 0(default_pg) Rank 3] boom", 2024)
    assert (info.rank, info.local_rank, info.level, info.cue) == (3, 1, "E",
                                                                  "torch [rankN]: prefix")
    assert info.body.endswith("boom") and info.stream == "l=1"


def test_custom_launcher_template_with_global_rank() -> None:
    info = parse_line("[trainer0|5]:RuntimeError: x", 2024)
    assert (info.rank, info.local_rank, info.cue) == (5, 0, "launcher prefix rank")
    # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${role_name}${local_rank}:${rank}]:"
    info = parse_line("[default2:6]:RuntimeError: x", 2024)
    assert (info.rank, info.local_rank, info.body) == (6, 2, "RuntimeError: x")


def test_mpirun_lightning_and_glog_prefixes() -> None:
    assert parse_line("[1,3]<stderr>:boom", 2024).rank == 3
    # horovodrun's own (Gloo) launcher tags with the rank alone
    assert (parse_line("[2]<stderr>:boom", 2024).rank,
            parse_line("[2]<stderr>:boom", 2024).body) == (2, "boom")
    light = parse_line("[rank: 2] Epoch 3 done", 2024)
    assert (light.rank, light.cue, light.body) == (2, "Lightning [rank: N] prefix", "Epoch 3 done")
    glog = parse_line("W1026 03:51:31.222000 2521679 torch/distributed/elastic/multiprocessing/"
                      "api.py:908] Sending process 2521733 closing signal SIGTERM", 2025)
    assert (glog.pid, glog.level, glog.body) == (2521679, "W",
                                                 "Sending process 2521733 closing signal SIGTERM")


def test_deepspeed_logger() -> None:
    info = parse_line("[2024-01-10 10:00:00,123] [INFO] [engine.py:1234:__init__] [Rank 3] "
                      "DeepSpeed info: version=0.14.0", 2024)
    assert (info.rank, info.cue) == (3, "message [Rank N]")
    assert info.body == "[Rank 3] DeepSpeed info: version=0.14.0"


def test_process_group_rank_is_global_only_for_the_default_group() -> None:
    assert parse_line("[PG 0 Rank 4] Watchdog ...", 2024).rank == 4
    sub = parse_line("[PG 3 Rank 1] Watchdog ...", 2024)
    assert (sub.rank, sub.pg, sub.pg_rank) == (None, 3, 1)


def test_nccl_prefix() -> None:
    info = parse_line("[default2]:gpu-a100-7:4242:4300 [2] NCCL INFO Init COMPLETE", 2024)
    assert (info.host, info.pid, info.local_rank) == ("gpu-a100-7", 4242, 2)


def test_srun_label_decided_per_file() -> None:
    lines = [f"{r:>2}: step {i} loss 0.1" for i in range(10) for r in range(12)]
    prefix = detect_prefixes(lines)
    assert prefix == FilePrefix(srun=True)
    info = parse_line(" 7: RuntimeError: CUDA error", 2024, prefix)
    assert (info.task, info.body, info.stream) == (7, "RuntimeError: CUDA error", "t=7")


def test_pdsh_hosts_decided_per_file() -> None:
    lines = [f"node{n}: [default{n}]:hello" for n in range(4)] * 5
    prefix = detect_prefixes(lines)
    assert prefix == FilePrefix(pdsh=True)
    info = parse_line("node2: [default1]:RuntimeError: x", 2024, prefix)
    assert (info.host, info.local_rank, info.stream) == ("node2", 1, "h=node2|l=1")


def test_error_lines_are_not_pdsh_hosts() -> None:
    lines = ["RuntimeError: one", "ValueError: two", "torch.OutOfMemoryError: three",
             "WARNING: four", "Traceback (most recent call last):", "  File \"x\", line 1"] * 5
    assert detect_prefixes(lines) == NO_PREFIX
    # Without the file's word, a line alone is never read as a prefix.
    assert parse_line("node1: RuntimeError: x", 2024).host is None


def test_a_minority_of_prefixed_lines_decides_nothing() -> None:
    lines = ["plain text line"] * 10 + [" 3: labelled"] * 4
    assert detect_prefixes(lines) == NO_PREFIX


def test_custom_bracket_prefix_spares_failure_summary_entries() -> None:
    lines = [f"[{r}]: step {i}" for i in range(5) for r in range(4)] + ["[0]:", "  rank : 0"]
    prefix = detect_prefixes(lines)
    assert prefix == FilePrefix(bracket=True)
    assert parse_line("[3]: RuntimeError: x", 2024, prefix).slot == 3
    entry = parse_line("[0]:", 2024, prefix)
    assert (entry.slot, entry.body) == (None, "[0]:")


def test_stacked_file_prefixes() -> None:
    lines = [f"node{h}: {t:>2}: hello" for h in range(2) for t in range(8)] * 3
    assert detect_prefixes(lines) == FilePrefix(pdsh=True, srun=True)


def test_pytest_prefix_decided_per_file() -> None:
    # The least padding after "E" is pytest's (an exception's own lines are indented after it).
    report = ["E       RuntimeError: boom", "E", "E         File \"a.py\", line 3, in f"]
    assert detect_prefixes(report) == FilePrefix(pytest=7)
    assert parse_line(report[2], 2026, FilePrefix(pytest=7)).body == '  File "a.py", line 3, in f'
    # A minority of "E" lines is a report only under pytest's own headers.
    lines = ["E   x", "E   y", "a", "b", "c", "d"]
    assert detect_prefixes(lines) == NO_PREFIX
    assert detect_prefixes(["____ test_x ____", *lines]).pytest == 3
    # Nor is a glog line or a word a marker.
    assert detect_prefixes(["E1218 20:27:21.426415 1 a.cpp:1] x"] * 3) == NO_PREFIX
    assert parse_line("Epoch 3", 2026, FilePrefix(pytest=7)).body == "Epoch 3"


def test_blocks_with_a_box_side() -> None:
    bar = "Map:  41%|████▏     | 4100/10000 [02:10<03:07, 31.4 ex/s] — done"  # E2 96 8x, E2 80 94
    assert not has_box(bar.encode()) and not has_box(b"plain\n")
    assert has_box(f"{bar}\n│ /a.py:3 in f │\n".encode())


def test_empty_sample() -> None:
    assert detect_prefixes([]) == NO_PREFIX
    assert detect_prefixes(["", None, ""]) == NO_PREFIX


PIECES = st.sampled_from([
    "node1: ", " 3: ", "[3]: ", "[default0]:", "[rank1]:", "[rank: 1] ", "[1,2]<stdout>:",
    "[E1218 20:27:21.426415540 a.cpp:1] ", "W1026 03:51:31.222000 1 a.py:9] ",
    "[2024-04-10 16:02:56,193] x: [INFO] ", "2024-05-01T10:11:12Z ", "[a.py:1:f] ",
    "h:1:2 [0] NCCL INFO ", "[PG 0 Rank 1] ", "[", "]", ":", " ", "\x00", "é", "",
    "E", "E   ", "│ ", " │", "╭─ Traceback (most recent call last) ─╮", "╰──╯", "❱ 3 │ ", "a.py:3 in f",
])


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=8), st.text(max_size=40))
def test_parse_line_never_raises_on_stacked_prefixes(pieces: list[str], rest: str) -> None:
    info = parse_line("".join(pieces) + rest, 2026, ALL)
    assert isinstance(info.body, str)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(PIECES, max_size=3).map("".join), max_size=30))
def test_detect_prefixes_never_raises(lines: list[str]) -> None:
    assert isinstance(detect_prefixes(lines), FilePrefix)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(PIECES, max_size=4).map("".join), max_size=30))
def test_unbox_never_raises_and_keeps_the_lines(lines: list[str]) -> None:
    out = unbox(pl.DataFrame({"text": lines}, schema={"text": pl.String}))
    assert out.height == len(lines)


def test_a_traceback_glued_to_a_cut_bar_is_its_own_message() -> None:
    glued = "[31:13<7:10:59, 908.45 eTraceback (most recent call last):"
    assert segments(glued) == ["[31:13<7:10:59, 908.45 e", "Traceback (most recent call last):"]
    for prefixed in ("[rank0]: Traceback (most recent call last):",
                     "[default0]:Traceback (most recent call last):",
                     "node3: Traceback (most recent call last):"):
        assert segments(prefixed) == [prefixed]


def test_torchrun_role_with_a_colon_names_the_local_rank() -> None:
    """torchrun --role "$(hostname -s):" --tee 3 writes "[host1:0]" and the text, no colon."""
    info = parse_line("[host1:2]AttributeError: 'list' object has no attribute 'sum'", 2026)
    assert (info.local_rank, info.body) == (2, "AttributeError: 'list' object has no attribute 'sum'")
    assert parse_line("[node-0:29500] listening", 2026).local_rank is None  # a port, not a local rank


def test_ray_dedup_suffix_and_vllm_logger_without_bracket() -> None:
    """vLLM < 0.8's logger ("ERROR 06-09 06:57:48 worker_base.py:581] ") under Ray's worker
    prefix, and Ray's " [repeated 6x across cluster]" (not part of the message)."""
    info = parse_line("(RayWorkerWrapper pid=45464, ip=10.0.0.7) ERROR 06-09 06:57:48 "
                      "worker_base.py:581] RuntimeError: CUDA out of memory. "
                      "[repeated 6x across cluster]", 2025)
    assert (info.pid, info.host, info.level) == (45464, "10.0.0.7", "E")
    assert info.body == "RuntimeError: CUDA out of memory."
    # a message that mentions the words is left alone
    assert parse_line("repeated 6x across cluster: fine", 2025).body == \
        "repeated 6x across cluster: fine"


def test_capitalised_torch_rank_prefix_is_the_global_rank() -> None:
    """verl's workers print "[Rank7]:" (not a launcher's "[default7]:"); the message's own
    "[Rank 3]" is a rank of a sub-group there."""
    info = parse_line("(WorkerDict pid=66442) [Rank7]:[T506 14:16:14.487575902 ProcessGroupNCCL."
                      "cpp:629] [Rank 3] Watchdog caught collective operation timeout", 2025)
    assert (info.rank, info.local_rank, info.cue) == (7, None, "torch [rankN]: prefix")


def test_a_quote_of_a_quote_is_stripped() -> None:
    """GitHub's quote-reply of a quoted log: every line starts "> > "."""
    lines = ["> > gpu11:18226:18274 [5] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.",
             "> > gpu04:589474:589541 [0] NCCL INFO Plugin Path : /opt/hpcx/libnccl-net.so"]
    info = parse_line(lines[0], 2025, detect_prefixes(lines))
    assert (info.host, info.pid) == ("gpu11", 18226)


def test_markdown_emphasis_around_a_pasted_line_is_stripped() -> None:
    """A bug report bolds the decisive line or sets each line in inline code: the message is
    what is inside; a line that only starts or ends with the marks is left alone."""
    bold = parse_line("[rank1]: **RuntimeError: connect() timed out.**", 2025)
    assert (bold.rank, bold.body) == (1, "RuntimeError: connect() timed out.")
    code = parse_line("`Exception: Unable to unpickle data from other workers.`", 2025)
    assert code.body == "Exception: Unable to unpickle data from other workers."
    assert parse_line("**kwargs were passed", 2025).body == "**kwargs were passed"
    assert parse_line("__init__ done", 2025).body == "__init__ done"


def test_ray_task_prefix_without_ip() -> None:
    """Ray's local workers and SkyPilot's tasks print "(name, pid=N)" with no "ip=": a process
    prefix, stripped like the remote form."""
    info = parse_line("(train-job-2, pid=16959)   File \"/opt/x.py\", line 3, in f", 2025)
    assert (info.pid, info.body) == (16959, '  File "/opt/x.py", line 3, in f')


def test_vllm_v1_worker_prefix_names_its_tensor_parallel_rank() -> None:
    info = parse_line("(VllmWorker TP3 pid=408) INFO 08-25 12:24:19 [multiproc_executor.py:520] "
                      "Parent process exited, terminating worker", 2025)
    assert (info.rank, info.pid) == (3, 408)


def test_log_collector_host_after_its_stamp() -> None:
    info = parse_line("2026-01-09 17:40:31.169213 master-0 >> [rank7]: RuntimeError: x", 2026)
    assert (info.host, info.rank, info.body) == ("master-0", 7, "RuntimeError: x")
    assert info.ts is not None
    # without the stamp, ">>" is text (a shell prompt, a quoted redirect)
    assert parse_line("master-0 >> RuntimeError: x", 2026).host is None
