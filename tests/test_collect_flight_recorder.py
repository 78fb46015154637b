"""Triggering and finding Flight Recorder dumps (collectors/flight_recorder.py)."""

from __future__ import annotations

import os
from pathlib import Path

from ddp_autopsy.collectors import (
    flight_recorder,
)


def test_flight_recorder_pipe_outcomes(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo)
    assert flight_recorder.poke_pipe(str(fifo)) == "no_reader"
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert flight_recorder.poke_pipe(str(fifo)) == "triggered"
        assert os.read(reader, 16) == b"1\n"
    finally:
        os.close(reader)
    (tmp_path / "file.pipe").write_text("")
    assert flight_recorder.poke_pipe(str(tmp_path / "file.pipe")) == "not_fifo"
    assert flight_recorder.poke_pipe(str(tmp_path / "missing.pipe")) == "absent"


def test_flight_recorder_plan() -> None:
    plan = flight_recorder.plan([
        (0, {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/pipe_", "TORCH_FR_DUMP_TEMP_FILE": "/d/fr_",
             "HOME": "/home/u"}, "/job"),
        (1, {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/pipe_"}, "/job"),
        (2, {"TORCH_FR_DUMP_TEMP_FILE": "dumps/fr_"}, "/job"),  # relative to the worker's cwd
    ])
    assert plan.pipes == ["/x/pipe_0.pipe", "/x/pipe_1.pipe"]
    assert plan.prefixes[:2] == ["/d/fr_", "/job/dumps/fr_"]
    assert "/tmp/nccl_trace_rank_" in plan.prefixes
    assert "/home/u/.cache/torch/nccl_trace_rank_" in plan.prefixes
