"""Property tests of the input readers (hypothesis), a few seconds each in CI.

- the line reader (``events.scan_text``, ``lines``): any bytes, any mix of real log lines and
  noise never raise, and every input line is counted (events point at real lines);
- the archive reader (``sources``): random, truncated and corrupted tar, zip, gz and zst inputs
  end in notes, never a traceback, and nothing is written anywhere (read in place).

``INPUT_FUZZ_EXAMPLES=5000`` hunts longer than CI's fixed count.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ddp_autopsy.analyzer.events import FileContext, ScanStats, scan_text, search
from ddp_autopsy.analyzer.grep import grep
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.analyzer.lines import detect_prefixes, parse_line
from ddp_autopsy.analyzer.sources import InputNote
from ddp_autopsy.rules.engine import registry

N = int(os.environ.get("INPUT_FUZZ_EXAMPLES", "0"))
FAST = settings(max_examples=N or 150, deadline=None, derandomize=not N,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=N or 40, deadline=None, derandomize=not N,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Real lines: every rule's documented example (launcher prefixes, tracebacks, NCCL, elastic).
REAL_LINES = sorted({line for rule in registry() for line in rule.example().splitlines()
                     if line.strip()})
NOISE = ["\x00", "\r", "\t", "\ufeff", "\udcff", "é", "\u2028", "\x1b[2J", "[rank3]:", "[1]:",
         "  ", 'File "x.py", line 1, in f', "Traceback (most recent call last):",
         "RuntimeError: ", "[default0]:", "2024-01-02 03:04:05,678 ", "I0102 03:04:05.678 ",
         "ChildFailedError", "=" * 40, "Root Cause (first observed failure):", "  rank      : "]
line_st = st.one_of(st.sampled_from(REAL_LINES), st.sampled_from(NOISE),
                    st.lists(st.one_of(st.sampled_from(NOISE), st.sampled_from(REAL_LINES),
                                       st.text(max_size=12)), max_size=5).map("".join))
log_st = st.one_of(
    st.binary(max_size=3000),
    st.lists(line_st, max_size=60).map(lambda ls: "\n".join(ls).encode("utf-8",
                                                                      "surrogateescape")),
    st.tuples(st.lists(line_st, max_size=40), st.binary(max_size=50), st.integers(0, 10_000))
    .map(lambda t: _splice("\n".join(t[0]).encode("utf-8", "surrogateescape"), t[1], t[2])),
)


def _splice(data: bytes, junk: bytes, at: int) -> bytes:
    at = at % (len(data) + 1)
    return data[:at] + junk + data[at:]


def expected_lines(data: bytes) -> int | None:
    """How many lines the reader must count (None: UTF-16, re-encoded first)."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return None
    if data.startswith(codecs.BOM_UTF8):
        data = data[3:]
    data = data.replace(b"\x00", b"")
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


@FAST
@given(log_st)
@example(b"x^2 is the loss\nRuntimeError: boom\n")  # zlib's header: polars would inflate it
@example(b"(\xb5/\xfd\nRuntimeError: boom\n")  # zstd's magic
@example(b"\x1f\x8b\x08\nRuntimeError: boom")  # gzip's
def test_line_reader_counts_every_line_and_never_raises(data: bytes) -> None:
    notes: list[InputNote] = []
    stats = ScanStats()
    events = scan_text(io.BytesIO(data), FileContext("fuzz.log", 2024), notes, stats)
    binary = any("binary file" in n.message for n in notes)
    want = expected_lines(data)
    if binary:
        assert stats.lines == 0 and not events
    elif want is not None:
        assert stats.lines == want, (stats.lines, want)
        # (the bytes read are the file's unless a note says the reader undid a paste's
        # typography or unwrapped an export, one line for one line)
        rewritten = any(w in n.message for n in notes
                        for w in ("copied through", "field read", "hard-wrapped"))
        assert rewritten or stats.bytes == len(data) - data.count(b"\x00") - \
            (3 if data.startswith(codecs.BOM_UTF8) else 0)
    assert all(1 <= e["line"] <= stats.lines for e in events)
    assert all(not n.message.startswith("read stopped") for n in notes), notes
    frame = pl.DataFrame(events, schema=None) if events else None  # rows build a frame
    assert frame is None or frame.height == len(events)
    found = search(io.BytesIO(data), "fuzz.log", [], ".*")
    if not binary and want is not None:
        assert found.height == stats.lines
        assert found["line"].to_list() == list(range(1, stats.lines + 1))


@FAST
@given(st.lists(line_st, min_size=1, max_size=30))
def test_prefixes_and_lines_parse_anything(lines: list[str]) -> None:
    clean = [x.encode("utf-8", "replace").decode() for x in lines]
    prefix = detect_prefixes(pl.Series("text", clean))
    for x in clean:
        info = parse_line(x, 2024, prefix)
        assert isinstance(info.body, str)
        assert info.rank is None or info.rank >= 0


# --- archives ------------------------------------------------------------------------------

LOG = (b"[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 9, in "
       b"<module>\n[rank1]: RuntimeError: fuzzed\n") * 3


def _tar(mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name in ("logs/rank1.log", "../up.log", "/abs.log"):
            info = tarfile.TarInfo(name)
            info.size = len(LOG)
            tf.addfile(info, io.BytesIO(LOG))
    return buf.getvalue()


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("logs/rank1.log", LOG)
        zf.writestr("../up.log", LOG)
    return buf.getvalue()


def _zst(data: bytes) -> bytes | None:
    if not shutil.which("zstd"):
        return None
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True,
                          check=True).stdout


ARCHIVES: dict[str, bytes | None] = {
    "x.tar": _tar("w"), "x.tar.gz": _tar("w:gz"), "x.tar.bz2": _tar("w:bz2"),
    "x.tar.xz": _tar("w:xz"), "x.zip": _zip(), "x.log.gz": gzip.compress(LOG),
    "x.log.bz2": bz2.compress(LOG), "x.log.xz": lzma.compress(LOG), "x.tar.zst": _zst(_tar("w")),
    "x.log.zst": _zst(LOG),
}
NAMES = [k for k, v in ARCHIVES.items() if v is not None]


@st.composite
def damaged(draw: st.DrawFn) -> tuple[str, bytes]:
    """An archive truncated, with bytes flipped or spliced in, or random bytes behind its
    magic number."""
    name = draw(st.sampled_from(NAMES))
    good = ARCHIVES[name]
    assert good is not None
    how = draw(st.sampled_from(["truncate", "flip", "splice", "random", "intact"]))
    if how == "truncate":
        data = good[: draw(st.integers(0, len(good)))]
    elif how == "flip":
        data = bytearray(good)
        for pos in draw(st.lists(st.integers(0, len(good) - 1), min_size=1, max_size=8)):
            data[pos] ^= draw(st.integers(1, 255))
        data = bytes(data)
    elif how == "splice":
        data = _splice(good, draw(st.binary(min_size=1, max_size=64)), draw(st.integers(0, 10**6)))
    elif how == "random":
        data = good[:6] + draw(st.binary(max_size=2000))
    else:
        data = good
    return name, data


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _analyze_in_place(name: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "in").mkdir()
        (root / "in" / name).write_bytes(data)
        (root / "cwd").mkdir()
        before = _listing(root)
        cwd = os.getcwd()
        os.chdir(root / "cwd")
        try:
            job = load([root / "in" / name])
            notes: list[InputNote] = []
            hits = list(grep([root / "in" / name], "fuzzed", notes))
        finally:
            os.chdir(cwd)
        assert _listing(root) == before  # nothing extracted, nothing written
        assert job.notes or job.readable
        if data == ARCHIVES[name]:
            assert "fuzzed" in " ".join(job.events["text"].to_list())
            assert hits
        for note in job.notes:
            assert note.path.startswith(str(root / "in"))


@SLOW
@given(damaged())
def test_damaged_archives_end_in_notes_never_raise(case: tuple[str, bytes]) -> None:
    _analyze_in_place(*case)


@pytest.mark.parametrize("name", NAMES)
def test_intact_archives_are_read(name: str) -> None:
    data = ARCHIVES[name]
    assert data is not None
    _analyze_in_place(name, data)
