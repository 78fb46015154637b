"""The native reader's threads (``_frpickle.Reader``): files read and parsed ahead of the caller
without the GIL give what reading them one by one gives, whatever the files hold; strings are
checked as Python's UTF-8 decoder checks them; an abandoned reader stops its threads."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_flight_recorder import nccl_dump, nccl_entry

from ddp_autopsy.analyzer import flight_recorder as fr
from ddp_autopsy.analyzer import fr_reader
from ddp_autopsy.analyzer.fr_reader import DumpFile

pytestmark = pytest.mark.skipif(
    fr._frpickle is None and os.environ.get("DDP_AUTOPSY_REQUIRE_NATIVE") != "1",
    reason="the native reader is not built (no C compiler at install)")


def _with_string(raw: bytes) -> bytes:
    """A dump whose first entry's ``state`` is the string written as the bytes ``raw`` (which
    need not be valid UTF-8)."""
    mark = "\u2603" * 3
    entries = [nccl_entry(1, state="completed"), nccl_entry(2, state="started")]
    entries[0]["state"] = mark
    data = pickle.dumps({"version": "2.10", "entries": entries}, protocol=2)
    token = b"X" + struct.pack("<I", len(mark.encode())) + mark.encode()  # BINUNICODE
    assert data.count(token) == 1
    return data.replace(token, b"X" + struct.pack("<I", len(raw)) + raw)


UTF8_CASES = [
    b"ok", "é".encode(), "\u20ac".encode(), "\U0001f600".encode(),
    b"\xed\xa0\x80",  # a lone surrogate: passes ("surrogatepass")
    b"\xed\xbf\xbf", b"\xc0\xaf", b"\xc1\xbf",  # overlong
    b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",  # > U+10FFFF
    b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"a\xc3(", b"\xff", b"\xfe",
    b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xe0\xa0\x80", b"\xf0\x90\x80\x80", b"\x00",
]


@pytest.mark.parametrize("raw", UTF8_CASES)
def test_strings_checked_as_python_decodes(raw: bytes) -> None:
    """A string the native reader accepts is one Python's unpickler decodes, to the same text;
    one it cannot decode leaves the dump to Python's unpickler (and its message)."""
    _check_string(raw)


@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=1, max_size=6))
def test_any_bytes_checked_as_python_decodes(raw: bytes) -> None:
    _check_string(raw)


def _check_string(raw: bytes) -> None:
    data = _with_string(raw)
    try:
        text: str | None = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        text = None
    parsed = fr._parse_native(data)
    if text is None:
        assert parsed is None
    else:
        assert isinstance(parsed, tuple)
        state = parsed[2][6]  # a Column of text, or a list (lone surrogates)
        first = state[0] if type(state) is list else pl.Series("state", state)[0]
        assert first == text
    py, nat = (fr.DumpReader(native=n) for n in (False, True))
    with py, nat:
        a, b = py.add(data, "nccl_trace_rank_0"), nat.add(data, "nccl_trace_rank_0")
    assert (a.status, a.error) == (b.status, b.error)
    assert a.entries.equals(b.entries)


def _files(d: Path) -> list[DumpFile]:
    """Dumps of every kind, as files: good ones (several protocols), a skipped collective,
    JSON, empty, truncated, a memo index far beyond the file, nesting deeper than the native
    reader goes, strings Python cannot decode or polars cannot hold, text, a file too large
    for the native reader, a directory, a missing file."""
    good = [nccl_dump([nccl_entry(i, state="completed" if i < 8 else "started")
                       for i in range(1, n)]) for n in (9, 8)]
    deep: object = "x"
    for _ in range(60):
        deep = [deep]
    nested = [nccl_entry(1), nccl_entry(2)]
    nested[0]["state"] = deep
    contents = {
        "good": good[0], "skipped": good[1], "protocol4": pickle.dumps(
            pickle.loads(good[0]), protocol=4),
        "json": b'{"version": "2.7", "pg_config": {}, "entries": []}', "empty": b"",
        "truncated": good[0][: len(good[0]) // 2], "memo": b"\x80\x02}r\x00\x00\x00\x80.",  # memo index 2**31
        "nested": pickle.dumps({"version": "2.10", "entries": nested}, protocol=2),
        "bad_utf8": _with_string(b"\xc0\xaf"), "surrogate": _with_string(b"\xed\xa0\x80"),
        "text": b"not a dump\n",
    }
    files = []
    for rank, (name, data) in enumerate(contents.items()):
        path = d / f"{name}_rank{rank}"
        path.write_bytes(data)
        files.append(DumpFile(str(path), f"node/{path.name}", host="node"))
    big = d / "big_rank40"
    with big.open("wb") as fh:  # sparse: beyond the native reader's 64 MB
        fh.write(good[0])
        fh.truncate(65 << 20)
    (d / "dir_rank41").mkdir()
    files += [DumpFile(str(big), "node/big_rank40"),
              DumpFile(str(d / "dir_rank41"), "node/dir_rank41"),
              DumpFile(str(d / "missing_rank42"), "node/missing_rank42")]
    return files


def _one_by_one(files: list[DumpFile]) -> list[fr.FRDump]:
    with fr.DumpReader() as reader:
        return [fr_reader.read_file(f, reader) for f in files]


@pytest.mark.parametrize("workers", ["0", "1"])
def test_threads_read_what_files_read_one_by_one(tmp_path: Path, workers: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(tmp_path)
    monkeypatch.setenv("DDP_AUTOPSY_WORKERS", workers)
    alone = _one_by_one(files)
    threaded = fr_reader.read_files(files)
    assert [d.source for d in threaded] == [f.source for f in files]
    keys = ("status", "error", "format", "version", "bytes", "dumped_at", "rank", "host",
            "groups")
    assert [[getattr(d, k) for k in keys] for d in threaded] == \
        [[getattr(d, k) for k in keys] for d in alone]
    for a, b in zip(alone, threaded, strict=True):
        assert a.entries.equals(b.entries), a.source
    status = {d.source.split("/")[1].rsplit("_", 1)[0]: d.status for d in threaded}
    assert status == {"good": "ok", "skipped": "ok", "protocol4": "ok", "json": "ok",
                      "empty": "empty", "truncated": "corrupt", "memo": "corrupt",
                      "nested": "ok", "bad_utf8": "corrupt", "surrogate": "corrupt",
                      "text": "not_a_dump", "big": "ok", "dir": "corrupt", "missing": "corrupt"}
    assert "memo index" in (threaded[6].error or "")


def test_take_in_order_once(tmp_path: Path) -> None:
    files = _files(tmp_path)[:4]
    r = fr._frpickle.Reader([os.fsencode(f.path) for f in files], 1, 2)
    with pytest.raises(IndexError):
        r.take(1)
    kind, _, size, mtime = r.take(0)
    assert kind == "parsed" and size == os.path.getsize(files[0].path)
    assert mtime == os.stat(files[0].path).st_mtime
    with pytest.raises(IndexError):
        r.take(0)
    with pytest.raises(ValueError):
        fr._frpickle.Reader([], 9)


def test_an_abandoned_reader_stops_its_threads(tmp_path: Path) -> None:
    """Dropped after a few dumps (an error in the caller), with threads waiting to read ahead
    or in the middle of a file: it returns at once, frees everything, and can be made again."""
    data = nccl_dump([nccl_entry(i, state="completed") for i in range(1, 400)])
    for i in range(64):
        (tmp_path / f"nccl_trace_rank_{i}").write_bytes(data)
    code = (
        "import glob, os, sys\n"
        "from ddp_autopsy.analyzer import _frpickle\n"
        "paths = [os.fsencode(p) for p in sorted(glob.glob(sys.argv[1] + '/*'))]\n"
        "for round in range(50):\n"
        "    r = _frpickle.Reader(paths, 2 if round % 2 else 1, 4)\n"
        "    for i in range(round % 5):\n"
        "        assert r.take(i)[0] == 'parsed'\n"
        "    del r\n"
        "print('done')\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
