"""Reading Flight Recorder dumps in two processes gives what reading them in one gives, whatever
the dumps hold and whatever happens to the helper process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from test_flight_recorder import nccl_dump, nccl_entry

from ddp_autopsy.analyzer import flight_recorder as fr
from ddp_autopsy.analyzer import fr_reader
from ddp_autopsy.analyzer.fr_reader import DumpFile, read_files

RANKS = 40


@pytest.fixture(scope="module")
def dump_files(tmp_path_factory: pytest.TempPathFactory) -> list[DumpFile]:
    """40 ranks' dumps, good and bad: every kind of status a dump can end with."""
    d = tmp_path_factory.mktemp("fr")
    files = []
    for rank in range(RANKS):
        path = d / f"nccl_trace_rank_{rank}"
        seqs = range(1, 30 if rank != 17 else 29)  # rank 17 skipped the last collective
        data = nccl_dump([nccl_entry(i, state="completed" if i < 28 else "started")
                          for i in seqs])
        if rank == 5:
            data = b""
        elif rank == 6:
            data = data[: len(data) // 2]
        elif rank == 7:
            data = json.dumps({"version": "2.7", "entries": []}).encode() + b"\0\0"
        path.write_bytes(data)
        files.append(DumpFile(str(path), f"node-a/{path.name}", host="node-a"))
    files.append(DumpFile(str(d / "nccl_trace_rank_99"), "missing/nccl_trace_rank_99"))
    return files


def _table(dumps: list[fr.FRDump]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    frames = fr.build_frames(dumps)
    return frames.collectives, frames.dumps, frames.groups


def test_two_processes_read_what_one_reads(dump_files: list[DumpFile]) -> None:
    alone = read_files(dump_files, helper=False)
    helped = read_files(dump_files, helper=True)
    assert [d.source for d in helped] == [f.source for f in dump_files]
    assert [(d.status, d.rank, d.host, d.error) for d in helped] == \
        [(d.status, d.rank, d.host, d.error) for d in alone]
    for a, b in zip(_table(alone), _table(helped), strict=True):
        assert a.equals(b)
    statuses = {d.rank: d.status for d in helped}
    assert statuses[5] == "empty" and statuses[6] == "corrupt" and statuses[99] == "corrupt"


def test_the_helper_alone_delivers_every_dump(dump_files: list[DumpFile], tmp_path: Path) -> None:
    """The helper process on its own (the caller never claims anything, so it takes all): its
    frames and fields come back through the Arrow file and the JSON unchanged."""
    n = len(dump_files)
    (tmp_path / "files.json").write_text(json.dumps([[f.path, f.source, f.host]
                                                     for f in dump_files]))
    (tmp_path / "claims").write_bytes(fr_reader._CLAIMS.pack(0, n))
    proc = subprocess.Popen([*fr_reader.HELPER_COMMAND, str(tmp_path)])
    got = fr_reader._collect(proc, tmp_path, n)
    assert sorted(got) == list(range(n))
    alone = read_files(dump_files, helper=False)
    for a, b in zip(_table(alone), _table([got[k] for k in range(n)]), strict=True):
        assert a.equals(b)
    assert fr_reader._CLAIMS.unpack((tmp_path / "claims").read_bytes()) == (0, 0)


FAILING_HELPERS = {
    # cannot do anything
    "exits at once": "import sys; sys.exit(3)",
    # claims the back half, then dies without a word (a crash, the OOM killer)
    "dies after claiming": (
        "import mmap, struct, sys\n"
        "d = sys.argv[1]\n"
        "with open(d + '/claims', 'r+b') as fh, mmap.mmap(fh.fileno(), 16) as m:\n"
        "    n = struct.unpack_from('<q', m, 8)[0]\n"
        "    struct.pack_into('<q', m, 8, n // 2)\n"
        "sys.exit(-9)\n"),
    # says it succeeded but wrote nonsense
    "writes garbage": (
        "import mmap, struct, sys\n"
        "d = sys.argv[1]\n"
        "with open(d + '/claims', 'r+b') as fh, mmap.mmap(fh.fileno(), 16) as m:\n"
        "    n = struct.unpack_from('<q', m, 8)[0]\n"
        "    struct.pack_into('<q', m, 8, n // 2)\n"
        "open(d + '/dumps.json', 'w').write('[{\"index\": 999, \"rows\": 5}]')\n"),
}


@pytest.mark.parametrize("helper", sorted(FAILING_HELPERS))
def test_a_failing_helper_costs_time_not_results(dump_files: list[DumpFile], helper: str) -> None:
    alone = read_files(dump_files, helper=False)
    helped = read_files(dump_files, helper=True,
                        command=[sys.executable, "-c", FAILING_HELPERS[helper]])
    for a, b in zip(_table(alone), _table(helped), strict=True):
        assert a.equals(b)


def test_cannot_start_helper(dump_files: list[DumpFile], tmp_path: Path) -> None:
    helped = read_files(dump_files, helper=True, command=[str(tmp_path / "no-such-python")])
    assert _table(helped)[0].equals(_table(read_files(dump_files, helper=False))[0])


def test_analyze_gives_the_same_verdict_either_way(dump_files: list[DumpFile]) -> None:
    """End to end through the CLI: the helper forced on, then off."""
    root = str(Path(dump_files[0].path).parent)
    out = {}
    for workers in ("0", "1"):
        res = subprocess.run([sys.executable, "-m", "ddp_autopsy", "analyze", root,
                              "--format", "json"], capture_output=True, text=True,
                             env={**os.environ, "DDP_AUTOPSY_WORKERS": workers},
                             check=False)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        out[workers] = (doc["verdict"], doc["findings"], doc["inputs"])
    assert out["0"] == out["1"]
    verdict = out["1"][0]
    assert verdict is not None and 17 in verdict["ranks"]
