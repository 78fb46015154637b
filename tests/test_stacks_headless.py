"""py-spy text dumps pasted without their "Process"/"Python v" headers (issue threads, logbooks):
still read as stack dumps, threads listed together sharing the stack that follows them."""

from __future__ import annotations

from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

SHARED = """Thread 1001 (active): "MainThread"
Thread 1002 (active): "MainThread"
Thread 1003 (active): "MainThread"
    broadcast (torch/distributed/distributed_c10d.py:1191)
    eval_batch (deepspeed/runtime/pipe/engine.py:455)
    main (pretrain_gpt.py:245)

Thread 1004 (idle): "MainThread"
    wait (threading.py:306)
    get (queue.py:179)
    _next_data (torch/utils/data/dataloader.py:1207)
    eval_batch (deepspeed/runtime/pipe/engine.py:453)
    main (pretrain_gpt.py:245)
"""


def test_headless_dump_is_read_and_tells_the_odd_process(tmp_path: Path) -> None:
    (tmp_path / "node7-py-spy.txt").write_text(SHARED)
    job = load([tmp_path / "node7-py-spy.txt"])
    main = job.stacks.filter(job.stacks["depth"] == 0)
    assert sorted(main["pid"].to_list()) == [1001, 1002, 1003, 1004]
    verdict = run(job).verdict
    assert verdict is not None and verdict.rule == "COLL002"
    assert "1004" in verdict.summary


def test_a_log_that_mentions_threads_stays_a_log(tmp_path: Path) -> None:
    log = 'Thread 12 (active): "loader" started\nepoch 1 step 10 loss 0.5\nepoch 1 step 20\n'
    (tmp_path / "train.log").write_text(log)
    job = load([tmp_path / "train.log"])
    assert job.stacks.height == 0
