"""Bad and odd input: every case becomes a clear note, never a traceback; inputs are untouched."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_autopsy.analyzer.events import FileContext, scan_text
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.analyzer.lines import parse_line
from ddp_autopsy.rules.engine import run

PORT_LINE = (
    "[W1122 05:01:02.220000000 socket.cpp:462] [c10d] The server socket has failed to bind to "
    "[::]:29500 (errno: 98 - Address already in use).\n"
)


def _logged(job):
    """The events of logged lines (not each writer's synthetic ``last_line``)."""
    return job.events.filter(job.events["kind"] != "last_line")


def _notes(job) -> str:
    return " | ".join(f"{n.path}: {n.message}" for n in job.notes)


def _digest(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def test_binary_file_is_noted_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "core.12345").write_bytes(b"\x7fELF\x00\x00\x01" * 1000)
    (tmp_path / "train.log").write_text(PORT_LINE)
    job = load([tmp_path])
    assert "binary file" in _notes(job) and "empty" not in _notes(job)
    assert {Path(i.path).name: i.kind for i in job.inputs} == {"core.12345": "skipped",
                                                               "train.log": "log"}
    assert run(job).verdict.cause == "port_in_use"


def test_only_unreadable_inputs_exit_3(tmp_path: Path) -> None:
    """A binary file alone is nothing readable: exit 3 with the reason, as for a missing path."""
    import sys

    (tmp_path / "core.1").write_bytes(bytes(range(256)) * 40)
    res = subprocess.run([sys.executable, "-m", "ddp_autopsy", "analyze", str(tmp_path / "core.1")],
                         capture_output=True, text=True)
    assert res.returncode == 3 and "binary file" in res.stderr


def test_invalid_utf8_is_replaced_and_still_parsed(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes(b"\xfa\xff garbage \xc3\x28\n" + PORT_LINE.encode())
    job = load([tmp_path])
    assert run(job).verdict.cause == "port_in_use"


def test_latin1_log_with_invalid_bytes_is_noted(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes(b"caf\xe9 \xe0 la gare\n" + PORT_LINE.encode())
    job = load([tmp_path])
    assert "invalid UTF-8" in _notes(job)
    assert _logged(job).height == 1


def test_huge_single_line_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with big.open("w") as fh:
        fh.write("x" * (100 << 20))
        fh.write("\n" + PORT_LINE)
    job = load([big])
    assert run(job).verdict.cause == "port_in_use"
    assert _logged(job)["line"].to_list() == [2]


def test_truncated_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    data = gzip.compress((PORT_LINE + "filler line\n" * 20000).encode())
    (tmp_path / "train.log.gz").write_bytes(data[: len(data) // 2])
    job = load([tmp_path])
    assert "truncated or corrupt" in _notes(job)
    assert run(job).verdict.cause == "port_in_use"


def test_empty_file_is_read_as_zero_lines(tmp_path: Path) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    job = load([tmp_path])
    assert [(i.kind, i.lines) for i in job.inputs] == [("log", 0)]
    assert [(n.message, n.level) for n in job.notes] == [("empty file (0 bytes)", "info")]
    assert run(job).verdict is None


def test_symlink_loop_and_dangling_link(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling.log").symlink_to(tmp_path / "missing.log")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "up").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "train.log").write_text(PORT_LINE)
    job = load([tmp_path])
    assert "symlink loop or dangling link" in _notes(job)
    assert run(job).verdict.cause == "port_in_use"


def test_missing_path_is_an_error_note(tmp_path: Path) -> None:
    job = load([tmp_path / "nope"])
    assert "does not exist" in _notes(job)
    assert not job.inputs


def test_hostile_tar_is_read_in_place_never_extracted(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name in ("/etc/evil.log", "../../escape.log", "ok/rank1.log"):
            payload = PORT_LINE.encode()
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    before = set(os.listdir(tmp_path)) | set(os.listdir(tmp_path.parent))
    job = load([archive])
    after = set(os.listdir(tmp_path)) | set(os.listdir(tmp_path.parent))
    assert before == after
    assert not Path("/etc/evil.log").exists()
    paths = set(job.events["source"].to_list())
    assert f"{archive}!etc/evil.log" in paths and f"{archive}!escape.log" in paths
    assert "never extracted" in _notes(job)
    # The member named after a rank is attributed to it.
    assert 1 in job.events.filter(job.events["source"].str.ends_with("rank1.log"))["rank"]


def test_corrupt_archive_is_noted(tmp_path: Path) -> None:
    (tmp_path / "bad.tar.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    job = load([tmp_path / "bad.tar.gz"])
    assert "archive" in _notes(job)


def test_zip_archive(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "logs.zip", "w") as zf:
        zf.writestr("node0/train.log", PORT_LINE)
    assert run(load([tmp_path / "logs.zip"])).verdict.cause == "port_in_use"


def test_html_in_log_lines_stays_text(tmp_path: Path) -> None:
    line = PORT_LINE.rstrip("\n") + ' <script>alert(1)</script>"><img src=x onerror=alert(2)>\n'
    (tmp_path / "train.log").write_text(line)
    analysis = run(load([tmp_path]))
    assert "<script>alert(1)</script>" in analysis.verdict.evidence[0].text


def test_inputs_are_not_modified(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text(PORT_LINE * 3)
    with gzip.open(tmp_path / "b.log.gz", "wt") as fh:
        fh.write(PORT_LINE)
    before = _digest(tmp_path)
    run(load([tmp_path]))
    assert _digest(tmp_path) == before


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_parse_line_never_raises(text: str) -> None:
    info = parse_line(text, 2026)
    assert isinstance(info.body, str)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000))
def test_scan_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    notes: list = []
    events = scan_text(io.BytesIO(data), FileContext("fuzz.log", 2026), notes)
    assert isinstance(events, list)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([
    PORT_LINE.rstrip("\n"),
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "t.py", line 3, in f',
    "[rank1]: ValueError: bad",
    "Root Cause (first observed failure):",
    "[0]:",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : -9 (pid: 12)",
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=1OpType=BARRIER), but Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=1OpType=ALLREDUCE).",
    "\x00\x01", "", "]:",
]), max_size=30))
def test_engine_never_raises_on_shuffled_messages(lines: list[str]) -> None:
    notes: list = []
    scan_text(io.BytesIO("\n".join(lines).encode()), FileContext("x.log", 2026), notes)


def test_nul_filled_hole_is_dropped_not_taken_for_binary(tmp_path: Path) -> None:
    # A log truncated while its writer kept its offset starts with a NUL-filled hole.
    (tmp_path / "train.log").write_bytes(b"\x00" * 200_000 + b"ok\n" + PORT_LINE.encode())
    job = load([tmp_path])
    assert "NUL bytes dropped" in _notes(job)
    assert _logged(job)["line"].to_list() == [2]


def test_nul_bytes_inside_lines(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes(b"a\x00b\n" + PORT_LINE.encode().replace(b"server", b"ser\x00ver"))
    job = load([tmp_path])
    assert _logged(job)["line"].to_list() == [2]
    assert "\x00" not in _logged(job)["text"][0]


def test_unreadable_file_is_noted(tmp_path: Path, monkeypatch) -> None:
    from ddp_autopsy.analyzer import sources

    (tmp_path / "secret.log").write_text(PORT_LINE)
    (tmp_path / "train.log").write_text(PORT_LINE)
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith("secret.log"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sources, "open", deny, raising=False)
    job = load([tmp_path])
    assert "Permission denied" in _notes(job)
    assert run(job).verdict.cause == "port_in_use"


@pytest.mark.parametrize("kind", ["bz2", "xz", "zst"])
def test_truncated_compressed_file_keeps_what_was_read(tmp_path: Path, kind: str) -> None:
    if kind == "zst" and not shutil.which("zstd"):
        pytest.skip("no zstd command")
    data = (PORT_LINE + "".join(f"filler line {i}\n" for i in range(50_000))).encode()
    if kind == "zst":
        packed = subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True).stdout
    else:
        packed = bz2.compress(data, 1) if kind == "bz2" else lzma.compress(data, preset=0)
    (tmp_path / f"train.log.{kind}").write_bytes(packed[: len(packed) // 2])
    job = load([tmp_path])
    assert "truncated or corrupt" in _notes(job)
    assert run(job).verdict.cause == "port_in_use"


def test_corrupt_zip_member_is_noted(tmp_path: Path) -> None:
    body = PORT_LINE + "".join(f"filler line {i}\n" for i in range(20_000))
    with zipfile.ZipFile(tmp_path / "logs.zip", "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("node0/train.log", body)
    raw = bytearray((tmp_path / "logs.zip").read_bytes())
    at = raw.index(b"filler line 19999")
    raw[at : at + 6] = b"XXXXXX"  # the stored CRC no longer matches
    (tmp_path / "logs.zip").write_bytes(bytes(raw))
    job = load([tmp_path / "logs.zip"])
    assert "truncated or corrupt" in _notes(job)
    assert run(job).verdict.cause == "port_in_use"


def test_utf16_log(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes(("héllo\n" + PORT_LINE).encode("utf-16"))
    job = load([tmp_path])
    assert _logged(job)["line"].to_list() == [2]


def test_over_long_line_is_cut_and_noted(tmp_path: Path, monkeypatch) -> None:
    from ddp_autopsy.analyzer import events

    monkeypatch.setattr(events, "BLOCK_BYTES", 1 << 12)
    monkeypatch.setattr(events, "LONG_LINE", 1 << 14)
    monkeypatch.setattr(events, "LONG_LINE_KEEP", 1 << 10)
    (tmp_path / "big.log").write_text("x" * (1 << 16) + PORT_LINE.rstrip("\n") + "\n" + PORT_LINE)
    job = load([tmp_path])
    assert "was cut" in _notes(job)
    assert _logged(job)["line"].to_list() == [1, 2]


LINES = st.sampled_from([
    PORT_LINE.rstrip("\n"), "", "\r", "plain text", "héllo wörld ✓ 日本", "x\ry",
    "[rank1]: Traceback (most recent call last):", '[rank1]:   File "t.py", line 3, in f',
    "[rank1]: ValueError: bad", "Root Cause (first observed failure):", "[0]:",
    "  rank      : 0 (local_rank: 0)", "  exitcode  : -9 (pid: 12)",
    "gpu1:12:12 [0] NCCL INFO comm 0x5 rank 0 nranks 2 cudaDev 0 busId 1a000 - Init COMPLETE",
    "\x1f\x1e", "é" * 50,
])


@settings(max_examples=120, deadline=None)
@given(st.lists(LINES, max_size=60), st.sampled_from(["\n", "\r\n"]), st.integers(1, 200),
       st.booleans())
def test_block_size_never_changes_events_or_line_numbers(
    lines: list[str], eol: str, block: int, final_eol: bool
) -> None:
    from ddp_autopsy.analyzer import events

    data = (eol.join(lines) + (eol if final_eol else "")).encode()
    whole = scan_text(io.BytesIO(data), FileContext("x.log", 2026), [])
    saved = events.BLOCK_BYTES
    events.BLOCK_BYTES = block
    try:
        stats = events.ScanStats()
        pieces = scan_text(io.BytesIO(data), FileContext("x.log", 2026), [], stats)
    finally:
        events.BLOCK_BYTES = saved
    assert pieces == whole
    assert stats.lines == data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)


def test_search_reads_the_raw_lines_behind_events(tmp_path: Path) -> None:
    from ddp_autopsy.analyzer.events import search

    data = b"alpha\nbeta \xff RuntimeError\ngamma\ndelta\n"
    found = search(io.BytesIO(data), "x.log", [], r"Runtime\w+", numbers=[1, 4])
    assert found.rows() == [(1, "alpha"), (2, "beta \ufffd RuntimeError"), (4, "delta")]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty, enabled, shown", [(True, True, True), (False, True, False),
                                                 (True, False, False)])
def test_progress_only_on_a_terminal(tmp_path: Path, monkeypatch, tty: bool, enabled: bool,
                                     shown: bool) -> None:
    from ddp_autopsy.analyzer import progress

    monkeypatch.setattr(progress, "DELAY", 0.0)
    (tmp_path / "train.log").write_text(PORT_LINE * 1000)
    out = _Terminal() if tty else io.StringIO()
    with progress.reading(enabled, out):
        job = load([tmp_path])
    assert _logged(job).height == 1000
    assert ("reading logs" in out.getvalue()) is shown


def test_needle_lookup_is_the_same_vectorised_or_not(monkeypatch) -> None:
    from ddp_autopsy.analyzer import events

    data = "\n".join(["x", PORT_LINE.rstrip("\n"), "torch.OutOfMemoryError: CUDA out of memory",
                      "NCCL error: remote process exited or there was a network error"]).encode()
    python = scan_text(io.BytesIO(data), FileContext("x.log", 2026), [])
    monkeypatch.setattr(events, "FOUND_VECTORISED", 0)
    assert scan_text(io.BytesIO(data), FileContext("x.log", 2026), []) == python
    assert [r["kind"] for r in python] == ["port_in_use", "oom", "exception", "peer_closed",
                                           "last_line"]
