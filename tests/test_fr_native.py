"""The native Flight Recorder reader (``analyzer/_frpickle.c``) reads every dump exactly as
Python's unpickler path does, or leaves it to that path: same status, message, rows, groups.
Generated dumps of every value type in every field, shared and self-referencing values, every
pickle protocol, damaged, truncated and hostile files."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import time
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_flight_recorder import _batch_cases, nccl_dump, nccl_entry

from ddp_autopsy.analyzer import flight_recorder as fr

pytestmark = pytest.mark.skipif(
    fr._frpickle is None and os.environ.get("DDP_AUTOPSY_REQUIRE_NATIVE") != "1",
    reason="the native reader is not built (no C compiler at install)")


def read(data: bytes, native: bool, name: str = "fr/nccl_trace_rank_0") -> fr.FRDump:
    with fr.DumpReader(native=native) as reader:
        return reader.add(data, name)


def assert_same(data: bytes, name: str = "fr/nccl_trace_rank_0") -> fr.FRDump:
    """Both readers give the same dump; returns the native one."""
    py, nat = read(data, False, name), read(data, True, name)
    fields = ("status", "error", "format", "version", "comm_lib_version", "skipped_entries",
              "groups", "_pg_names")
    assert [getattr(py, f) for f in fields] == [getattr(nat, f) for f in fields]
    assert py.entries.schema == nat.entries.schema
    assert py.entries.equals(nat.entries), name
    return nat


def test_built_and_used() -> None:
    """The benchmark dump is read natively (not left to Python) and as Python reads it."""
    sys.path.insert(0, "benchmarks")
    import bench_fr

    data = pickle.dumps(bench_fr.make_dump(3, 16, 300, 5), protocol=2)
    assert isinstance(fr._parse_native(data), tuple)
    d = assert_same(data)
    assert d.ok and d.entries.height == 300
    assert d.entries["collective_seq_id"].to_list() == list(range(1, 301))
    assert d.entries["time_completed"].null_count() == 1  # the last all_reduce never finished


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_protocol(protocol: int) -> None:
    entries = [nccl_entry(i, state="started" if i == 9 else "completed") for i in range(1, 10)]
    top = pickle.loads(nccl_dump(entries))
    data = pickle.dumps(top, protocol=protocol)
    assert isinstance(fr._parse_native(data), tuple)
    assert_same(data)


def test_batch_cases_read_alike() -> None:
    """The varied, JSON, empty, truncated and unholdable dumps of the batch test, read in one
    batch by each reader: the same frames."""
    cases = _batch_cases()
    frames = []
    for native in (False, True):
        with fr.DumpReader(native=native) as reader:
            dumps = [reader.add(data, name) for name, data in cases.items()]
        frames.append(fr.build_frames(dumps))
    assert frames[0].collectives.equals(frames[1].collectives)
    assert frames[0].groups.equals(frames[1].groups)
    assert frames[0].dumps.equals(frames[1].dumps)


# --------------------------------------------------------------------------- generated dumps

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True), st.sampled_from(["completed", "started", "scheduled", "",
                                                 "nccl:all_reduce", "gloo:send 0->1", "Float",
                                                 "done\ud800", "é"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["name", "filename", "line", 1, None]), inner,
                    max_size=3)), max_leaves=6)


@st.composite
def dumps(draw: st.DrawFn) -> bytes:
    """A dump whose entries have any value in any field, shared values, missing keys."""
    n = draw(st.integers(1, 6))
    shared = draw(VALUES)
    entries = []
    for i in range(n):
        e = nccl_entry(i + 1)
        for key in draw(st.lists(st.sampled_from(sorted(e)), max_size=4)):
            e[key] = draw(st.one_of(VALUES, st.just(shared)))
        for key in draw(st.lists(st.sampled_from(sorted(e)), max_size=2)):
            e.pop(key, None)
        if draw(st.booleans()):
            e["duration_ms"] = draw(st.one_of(st.floats(), st.none(), st.integers(0, 5)))
        entries.append(e)
    if n > 1 and draw(st.booleans()):
        entries[-1] = entries[0]  # the same dict twice
    top: dict[Any, Any] = {"version": draw(st.one_of(st.just("2.10"), VALUES)),
                           "pg_config": draw(st.one_of(st.just({"0": {"name": "0",
                                                                      "ranks": "[0, 1]"}}),
                                                       VALUES)),
                           "pg_status": draw(VALUES), "entries": entries}
    return pickle.dumps(top, protocol=draw(st.integers(2, 5)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumps())
def test_generated_dumps_read_alike(data: bytes) -> None:
    assert_same(data)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_damaged_dumps_read_alike(data: st.DataObject) -> None:
    good = bytearray(nccl_dump([nccl_entry(i, state="completed") for i in range(1, 6)]))
    for _ in range(data.draw(st.integers(1, 6))):
        good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(good[:data.draw(st.integers(1, len(good)))])
    py, nat = read(damaged, False), read(damaged, True)
    if "memo index" in (nat.error or ""):  # refused before Python's unpickler allocates
        assert nat.status == py.status == "corrupt"
        return
    assert_same(damaged)


def test_truncated_at_every_byte() -> None:
    data = nccl_dump([nccl_entry(i) for i in range(1, 4)])
    for cut in range(2, len(data)):
        d = assert_same(data[:cut])
        assert d.status == "corrupt", cut


@pytest.mark.parametrize("version", ["2.10", "9.99", 7, None, ["2.10"]])
def test_any_version_reads_alike(version: Any) -> None:
    top = pickle.loads(nccl_dump([nccl_entry(1), nccl_entry(2)]))
    top["version"] = version
    d = assert_same(pickle.dumps(top, protocol=2))
    assert d.ok


# --------------------------------------------------------------------------- hostile files

SELF_REFERENCE = r"""
import pickle, sys
from ddp_autopsy.analyzer import flight_recorder as fr
sys.path.insert(0, "tests")
from test_fr_native import assert_same
data = next(iter(fr.example_dumps("rank 0: #1 all_reduce [[4]] Float completed | "
                                  "#2 all_reduce [[4]] Float started").values()))
for key in pickle.loads(data)["entries"][0]:
    for shape in ("itself", "in a list", "list in itself", "the top"):
        top = pickle.loads(data)
        entry = top["entries"][0]
        if shape == "list in itself":
            loop = []
            loop.append(loop)
            entry[key] = loop
        else:
            entry[key] = {"itself": entry, "in a list": [entry], "the top": top}[shape]
        d = assert_same(pickle.dumps(top, protocol=2), f"{key} {shape}_rank0")
        print(key, shape, d.status)
"""


def test_values_that_contain_themselves() -> None:
    """A container holding itself, in every field: both readers agree and neither crashes (in
    a child process, so that a crash fails this test and not the run)."""
    proc = subprocess.run([sys.executable, "-c", SELF_REFERENCE], capture_output=True,
                          text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) >= 4 * 20 and {ln.rsplit(" ", 1)[1] for ln in lines} <= {"ok", "corrupt"}


def _opcodes(*ops: bytes) -> bytes:
    return b"\x80\x02" + b"".join(ops)


def test_huge_and_lying_lengths_are_refused_fast() -> None:
    """Lengths and memo indexes that point far beyond the file: refused at once (no
    allocation to their size, no hang)."""
    cases = {
        "string of 4 GiB": _opcodes(b"}q\x00X\xff\xff\xff\xffabc."),
        "string8 of 2**63": _opcodes(b"\x8d" + struct.pack("<Q", 2**63) + b"abc."),
        "frame of 2**62": b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"}.",
        "long of 255 bytes": _opcodes(b"\x8a\xff" + b"\x01" * 10 + b"."),
        "memo get of 2**32-1": _opcodes(b"}j\xff\xff\xff\xff."),
    }
    for what, data in cases.items():
        t = time.monotonic()
        d = assert_same(data)
        assert d.status == "corrupt", what
        assert time.monotonic() - t < 2, what
    # A memo index of 2**31: Python's unpickler would allocate 32 GiB of memo for it.
    d = read(_opcodes(b"}r\x00\x00\x00\x80."), True)
    assert d.status == "corrupt" and "memo index 2147483648" in (d.error or ""), d.error


def test_a_huge_string_reads_alike() -> None:
    big = "x" * (8 << 20)
    entries = [nccl_entry(1), {**nccl_entry(2), "thread_name": big, "state": big[:100]}]
    d = assert_same(nccl_dump(entries))
    assert d.ok and d.entries["thread_name"][1] == big


def test_deep_nesting_and_wide_containers_do_not_hang() -> None:
    """Nesting far beyond a dump's and containers far wider, in a field: read alike, fast."""
    deep: Any = 0
    for _ in range(200):
        deep = [deep]
    wide = [[1] * 10] * 50_000  # 50,000 references to one list
    for value in (deep, wide, list(range(100_000)), {i: i for i in range(5000)}):
        entries = [{**nccl_entry(i), "input_sizes": value, "frames": value} for i in (1, 2, 3)]
        t = time.monotonic()
        assert_same(nccl_dump(entries))
        assert time.monotonic() - t < 20


def test_classes_are_refused_by_the_python_reader() -> None:
    """Anything but plain data is left to the restricted unpickler, which refuses it."""
    class Evil:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return (os.system, ("true",))

    data = pickle.dumps({"version": "2.10", "entries": [Evil()]}, protocol=2)
    assert fr._parse_native(data) is None
    assert read(data, True).status == "unsafe"


# --------------------------------------------------------------------------- columns


def test_int64_columns_go_to_polars_whole() -> None:
    m = fr._frpickle
    _top, n, raw, _ = m.parse(nccl_dump([nccl_entry(i) for i in range(1, 6)]))
    record_id = raw[0]
    assert type(record_id) is m.Column and len(record_id) == n == 5
    s = pl.Series("record_id", record_id)
    assert s.dtype == pl.Int64 and s.to_list() == [0, 1, 2, 3, 4]
    joined = m.join([record_id, record_id])
    assert pl.Series("x", joined).to_list() == [0, 1, 2, 3, 4] * 2
    assert raw[1] == (0,)  # pg_id: one value
    with pytest.raises(TypeError):
        m.join([record_id, [1, 2]])


def test_bool_and_text_columns_go_to_polars_whole() -> None:
    """``state``, ``retired``, ``is_p2p`` and ``thread_name`` of bools or text (and None) reach
    polars as Arrow arrays; a lone surrogate (polars cannot hold it) leaves a list for Python."""
    states = ["completed", "started", "scheduled", "é\u20ac\U0001f600", "", "completed"]
    entries = [nccl_entry(i, state=s) for i, s in enumerate(states, 1)]
    entries[1]["retired"], entries[2]["thread_name"], entries[3]["retired"] = None, None, True
    entries[4]["state"] = None
    data = nccl_dump(entries)
    m = fr._frpickle
    _top, _n, raw, _ = m.parse(data)
    state, retired, thread = raw[6], raw[7], raw[13]
    assert all(type(c) is m.Column for c in (state, retired, thread))
    assert pl.Series("s", state).dtype == pl.String
    assert pl.Series("s", state).to_list() == [e["state"] for e in entries]
    assert pl.Series("r", retired).dtype == pl.Boolean
    assert pl.Series("r", retired).to_list() == [e["retired"] for e in entries]
    assert pl.Series("t", thread).to_list() == [e["thread_name"] for e in entries]
    texts = [e["state"] for e in entries], [e["thread_name"] for e in entries]
    assert pl.Series("s", m.join([state, thread, state])).to_list() == \
        texts[0] + texts[1] + texts[0]
    with pytest.raises(TypeError):
        m.join([state, retired])
    assert_same(data)
    entries[0]["state"] = "done\ud800"
    assert type(m.parse(nccl_dump(entries))[2][6]) is list
    assert_same(nccl_dump(entries))
