"""Reading Flight Recorder dumps: every format version, pickle and JSON, any naming, hostile and
broken files — without torch. Real dumps come from a real Gloo job (the ``fr_skipped_allreduce``
scenario); NCCL-only versions are hand-written here in the formats torch writes
(``FlightRecorder.hpp``: pickle via ``torch::jit::Pickler``, JSON via nlohmann)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_autopsy.analyzer import flight_recorder as fr

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
FRAMES = [
    {"name": "all_reduce", "filename": "/opt/py/site-packages/torch/distributed/distributed_c10d.py",
     "line": 2696},
    {"name": "wrapper", "filename": "/opt/py/site-packages/torch/distributed/c10d_logger.py",
     "line": 83},
    {"name": "train_step", "filename": "/home/user/train.py", "line": 41},
    {"name": "main", "filename": "/home/user/train.py", "line": 90},
]
VERSIONS = ("2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")


def _v(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def nccl_entry(seq: int, *, version: str = "2.10", fmt: str = "pickle", op: str = "all_reduce",
               sizes: list[list[int]] | None = None, dtype: str = "Float",
               state: str = "completed", retired: bool | None = None, t: float | None = None,
               line: int = 41, record_id: int | None = None, pg: tuple[str, str] = ("0", "default_pg"),
               pg_id: int = 0, p2p: bool = False, timeout_ms: int = 600_000) -> dict[str, Any]:
    """One entry as ``FlightRecorder::getCollectiveTrace`` (pickle) or ``get_dump_json`` (JSON)
    writes it for ``version``."""
    sizes = [[4]] if sizes is None else sizes
    created = T0 + int((seq if t is None else t) * 1e9)
    started = created + 1000 if state in ("started", "completed") else None
    completed = created + 10**7 if state == "completed" else None
    e: dict[str, Any] = {}
    if fmt == "pickle":
        frames = [dict(f) for f in FRAMES]
        frames[0]["name"] = op.split(" ")[0]
        frames[2]["line"] = line
        e["frames"] = frames
    e.update({
        "record_id": seq - 1 if record_id is None else record_id, "pg_id": pg_id,
        "process_group": tuple(pg) if fmt == "pickle" else list(pg),
        "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "op_id": seq,
        "profiling_name": f"nccl:{op}", "time_created_ns": created,
    })
    e.update({"input_sizes": sizes, "input_dtypes": [dtype], "output_sizes": sizes,
              "output_dtypes": [dtype], "state": state,
              "time_discovered_started_ns": started if started or fmt == "pickle" else 0,
              "time_discovered_completed_ns": completed if completed or fmt == "pickle" else 0,
              "retired": state == "completed" if retired is None else retired,
              "timeout_ms": timeout_ms})
    if _v(version) >= (2, 3):
        e["is_p2p"] = p2p
    if _v(version) >= (2, 9):
        e["thread_id"] = "140354913500032"
        e["thread_name"] = "pt_main_thread"
    return e


def nccl_dump(entries: list[dict[str, Any]], *, version: str = "2.10", fmt: str = "pickle",
              ranks: str = "[0, 1, 2, 3]", enqueued: int | None = None,
              completed: int | None = None) -> bytes:
    """A whole dump: ``FlightRecorder::dump`` (pickle, protocol 2) or ``dump_json``."""
    enq = enqueued if enqueued is not None else max(
        (e["collective_seq_id"] for e in entries), default=-1)
    done = completed if completed is not None else max(
        (e["collective_seq_id"] for e in entries if e["state"] == "completed"), default=-1)
    top: dict[str, Any] = {"version": version}
    top["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    if (2, 6) <= _v(version) < (2, 10):
        top["nccl_version"] = "2.21.5"
    elif _v(version) >= (2, 10):
        top["comm_lib_version"] = "2.27.3"
    if _v(version) >= (2, 3):
        status = {"last_enqueued_collective": enq, "last_started_collective": enq,
                  "last_completed_collective": done}
        if fmt == "json":
            status = {k: str(v) for k, v in status.items()}
        top["pg_status"] = {"0": status}
    if fmt == "json":
        if entries:  # nlohmann: the key is left out when there are no entries
            top["entries"] = entries
        return json.dumps(top, sort_keys=True, separators=(",", ":")).encode()
    top["entries"] = entries
    return pickle.dumps(top, protocol=2)


# A JSON dump written out verbatim (2.7, two entries: a completed all_reduce, a timed-out one).
JSON_27 = (
    '{"entries":[{"collective_seq_id":1,"input_dtypes":["Float"],"input_sizes":[[3,4]],'
    '"is_p2p":false,"op_id":1,"output_dtypes":["Float"],"output_sizes":[[3,4]],"p2p_seq_id":0,'
    '"pg_id":0,"process_group":["0","default_pg"],"profiling_name":"nccl:all_reduce",'
    '"record_id":0,"retired":true,"state":"completed","time_created_ns":1767225601000000000,'
    '"time_discovered_completed_ns":1767225601010000000,'
    '"time_discovered_started_ns":1767225601000001000,"timeout_ms":600000},'
    '{"collective_seq_id":2,"input_dtypes":["BFloat16"],"input_sizes":[[1024]],"is_p2p":false,'
    '"op_id":2,"output_dtypes":["BFloat16"],"output_sizes":[[1024]],"p2p_seq_id":0,"pg_id":0,'
    '"process_group":["0","default_pg"],"profiling_name":"nccl:_allgather_base","record_id":1,'
    '"retired":true,"state":"started","time_created_ns":1767225602000000000,'
    '"time_discovered_completed_ns":0,"time_discovered_started_ns":1767225602000001000,'
    '"timeout_ms":600000}],"nccl_version":"2.21.5","pg_config":{"0":{"desc":"default_pg",'
    '"name":"0","ranks":"[0, 1]"}},"pg_status":{"0":{"last_completed_collective":"1",'
    '"last_enqueued_collective":"2","last_started_collective":"2"}},"version":"2.7"}'
)


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_and_format_reads(version: str, fmt: str) -> None:
    if fmt == "json" and _v(version) < (2, 4):
        pytest.skip("JSON dumps exist since 2.4 (PR #129505)")
    entries = [nccl_entry(1, version=version, fmt=fmt),
               nccl_entry(2, version=version, fmt=fmt, op="send 0->1", p2p=True,
                          state="completed"),
               nccl_entry(2, version=version, fmt=fmt, state="started", retired=True)]
    data = nccl_dump(entries, version=version, fmt=fmt)
    name = f"dumps/nccl_trace_rank_2{'.json' if fmt == 'json' else ''}"
    assert fr.looks_like_dump(data[:65536], name)
    d = fr.read_dump(data, name)
    assert (d.status, d.rank, d.format, d.version) == ("ok", 2, fmt, version), d.error
    assert d.comm_lib_version == (None if _v(version) < (2, 6) else
                                  "2.21.5" if _v(version) < (2, 10) else "2.27.3")
    df = d.entries
    assert df.schema == pl.Schema(fr.COLLECTIVES_SCHEMA)
    assert df["op"].to_list() == ["all_reduce", "send", "all_reduce"]
    assert df["is_p2p"].to_list() == [False, True, False]  # 2.2: from the profiling name
    assert df["peer"].to_list() == [None, 1, None]
    assert df["input_sizes"][0] == "[[4]]" and df["input_dtypes"][0] == "Float"
    assert df["pg_name"].unique().to_list() == ["0"]
    assert df["pg_desc"][0] == "default_pg"
    # "not yet" is None in pickle and 0 in JSON: both null here.
    assert df["time_completed"].is_null().to_list() == [False, False, True]
    assert df["time_created"][0].year == 2026
    if fmt == "pickle":
        assert df["site_func"].to_list() == ["train_step"] * 3
        assert df["site_line"][0] == 41 and df["site_file"][0] == "/home/user/train.py"
        assert df["api"].to_list() == ["all_reduce", "send", "all_reduce"]
    else:
        assert df["site_func"].null_count() == 3  # JSON dumps carry no stacks
    assert df["thread_name"][0] == ("pt_main_thread" if _v(version) >= (2, 9) else None)
    (group,) = d.groups
    assert group["members"] == [0, 1, 2, 3] and group["pg_desc"] == "default_pg"
    if _v(version) >= (2, 3):
        assert (group["last_enqueued"], group["last_completed"]) == (2, 1)
    else:
        assert group["last_enqueued"] is None  # no pg_status yet


def test_verbatim_json_27() -> None:
    d = fr.read_dump(JSON_27.encode(), "traces/nccl_trace_rank_1")
    assert d.status == "ok" and d.version == "2.7" and d.comm_lib_version == "2.21.5"
    df = d.entries
    assert df["op"].to_list() == ["all_reduce", "_allgather_base"]
    assert df["state"].to_list() == ["completed", "started"]
    assert df["input_dtypes"].to_list() == ["Float", "BFloat16"]
    assert df["time_completed"].null_count() == 1
    assert d.groups[0]["last_completed"] == 1 and d.groups[0]["members"] == [0, 1]


def test_pre_version_bare_list() -> None:
    entries = [nccl_entry(1, version="2.2"), nccl_entry(2, version="2.2")]
    d = fr.read_dump(pickle.dumps(entries, protocol=2), "old/nccl_trace_rank_0")
    assert d.status == "ok" and d.version is None and d.entries.height == 2


def test_json_without_entries_key_is_an_empty_dump_of_a_rank() -> None:
    data = nccl_dump([], fmt="json", version="2.10")
    assert b'"entries"' not in data
    d = fr.read_dump(data, "x/comm_lib_trace_rank_5")
    assert d.status == "ok" and d.rank == 5 and d.entries.height == 0


def test_columns_follow_every_entry_when_neighbours_differ() -> None:
    """Values are parsed once per run of equal neighbours: each entry still gets its own."""
    sizes = [[[4]], [[4]], [[8, 2]], [[4]], [[8, 2]], [[8, 2]]]
    lines = [41, 42, 42, 41, 41, 43]
    ops = ["all_reduce", "all_reduce", "broadcast", "all_reduce", "send 0->3", "all_reduce"]
    dtypes = ["Float", "Half", "Half", "Float", "Float", "BFloat16"]
    entries = [nccl_entry(i + 1, op=op, sizes=sz, line=ln, dtype=dt, p2p=op.startswith("send"),
                          pg=("0", "default_pg") if i < 3 else ("1", "tp"), pg_id=int(i >= 3))
               for i, (sz, ln, op, dt) in enumerate(zip(sizes, lines, ops, dtypes, strict=True))]
    shared = entries[0]["frames"]  # torch's pickler shares frame dicts between entries
    entries[1]["frames"] = [*shared[:2], {**shared[2], "line": 42}, shared[3]]
    entries[2]["frames"] = entries[1]["frames"][:]
    entries[3]["duration_ms"] = 2.5  # only some entries carry it (timing builds)
    df = fr.read_dump(nccl_dump(entries), "x/nccl_trace_rank_0").entries
    assert df["input_sizes"].to_list() == ["[[4]]", "[[4]]", "[[8, 2]]", "[[4]]", "[[8, 2]]",
                                           "[[8, 2]]"]
    assert df["site_line"].to_list() == lines
    assert df["op"].to_list() == ["all_reduce", "all_reduce", "broadcast", "all_reduce", "send",
                                  "all_reduce"]
    assert df["peer"].to_list() == [None, None, None, None, 3, None]
    assert df["input_dtypes"].to_list() == dtypes
    assert df["pg_name"].to_list() == ["0"] * 3 + ["1"] * 3
    assert df["pg_id"].to_list() == [0] * 3 + [1] * 3
    assert df["duration_ms"].to_list() == [None, None, None, 2.5, None, None]
    # entry 2 (a broadcast) was given entry 1's stack
    assert df["api"].to_list() == ["all_reduce"] * 4 + ["send", "all_reduce"]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_unpickler_reads_what_pickle_reads(protocol: int) -> None:
    value = {"entries": [{"k": i, "s": f"line {i}\n", "f": i / 3, "t": (i, None, True)}
                         for i in range(3000)], "big": "x" * 300_000, "n": -(2**70)}
    data = pickle.dumps(value, protocol=protocol)
    assert fr.unpickle_plain(data) == value
    for cut in (7, len(data) // 2, len(data) - 1):
        with pytest.raises((pickle.UnpicklingError, EOFError)):
            fr.unpickle_plain(data[:cut])


# --------------------------------------------------------------------------- real dumps


@pytest.mark.scenario("fr_skipped_allreduce")
def test_real_gloo_dumps_pickle_and_json(scenario_run) -> None:
    run = scenario_run("fr_skipped_allreduce")
    pickles = sorted((run.dir / "fr_dumps").iterdir())
    jsons = sorted((run.dir / "fr_json").iterdir())
    assert [p.name for p in pickles] == [f"nccl_trace_rank_{r}" for r in range(3)]
    assert len(jsons) == 3
    for path in [*pickles, *jsons]:
        data = path.read_bytes()
        assert fr.looks_like_dump(data[:65536], str(path)), path
        d = fr.read_dump(data, str(path))
        assert d.status == "ok" and d.version == "2.10", (path, d.error)
        assert set(d.entries["backend"]) == {"gloo"} and set(d.entries["op"]) == {"all_reduce"}
        assert d.entries["collective_seq_id"].to_list() == list(range(1, d.entries.height + 1))
        # Gloo: membership is not recorded (empty name), every finished entry is retired.
        assert d.groups[0]["members"] is None and d.groups[0]["pg_desc"] == "default_pg"
    by_rank = {fr.read_dump(p.read_bytes(), str(p)).rank: fr.read_dump(p.read_bytes(), str(p))
               for p in pickles}
    assert {r: d.entries.height for r, d in by_rank.items()} == {0: 9, 1: 8, 2: 9}
    sites = by_rank[0].entries["site_func"].unique().to_list()
    assert sites == ["main"], sites
    assert by_rank[0].entries["site_file"][0].endswith("fr_skipped_allreduce.py")
    host_json = fr.read_dump(jsons[0].read_bytes(), str(jsons[0]))
    assert host_json.host is not None and host_json.rank == 0  # <hostname>_rank0.json


# --------------------------------------------------------------------------- safety


class _Boom:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("touch /tmp/ddp_autopsy_fr_pwned",))


def test_hostile_pickle_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = Path("/tmp/ddp_autopsy_fr_pwned")
    marker.unlink(missing_ok=True)
    payload = pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Boom()]}, protocol=2)
    assert fr.looks_like_dump(payload, "nccl_trace_rank_0")
    d = fr.read_dump(payload, "nccl_trace_rank_0")
    assert d.status == "unsafe" and "posix.system" in (d.error or "")
    assert not marker.exists()
    d = fr.read_dump(pickle.dumps(pl.DataFrame({"a": [1]})), "nccl_trace_rank_1")
    assert d.status == "unsafe" and d.entries.height == 0


def test_broken_files_are_findings_not_crashes() -> None:
    good = nccl_dump([nccl_entry(i) for i in range(1, 50)])
    cases = {
        "empty": b"",
        "truncated pickle": good[: len(good) // 2],
        "truncated json": nccl_dump([nccl_entry(1, fmt="json")], fmt="json")[:100],
        "garbage": b"\x80\x02" + os.urandom(300),
        "wrong types": pickle.dumps({"version": 7, "entries": "nope"}, protocol=2),
        "list of junk": pickle.dumps({"version": "2.10", "entries": [1, "x", None]}, protocol=2),
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "not entries": pickle.dumps([1, 2, 3], protocol=2),
        # values no column can hold: text that is not UTF-8, a number beyond 64 bits
        "surrogate": nccl_dump([{**nccl_entry(1), "state": "done\ud800"}]),
        "huge peer": nccl_dump([nccl_entry(1, op="send 0->" + "9" * 5000, p2p=True)]),
    }
    statuses = {}
    for what, data in cases.items():
        d = fr.read_dump(data, "dumps/nccl_trace_rank_3")
        statuses[what] = d.status
        assert d.rank == 3
        if d.status != "ok":
            assert d.note() and "rank 3" in d.note()
    assert statuses["empty"] == "empty"
    assert statuses["truncated pickle"] == "corrupt"
    assert statuses["truncated json"] == "corrupt"
    assert statuses["garbage"] in ("corrupt", "unsafe", "not_a_dump")
    assert statuses["wrong types"] == "corrupt"
    assert statuses["list of junk"] == "ok"  # entries that are not dicts are skipped, counted
    assert fr.read_dump(cases["list of junk"], "x").skipped_entries == 3
    assert statuses["deep"] == "corrupt"
    assert statuses["not entries"] == "not_a_dump"
    assert statuses["surrogate"] == "corrupt"
    assert statuses["huge peer"] == "ok"
    assert fr.read_dump(cases["huge peer"], "x").entries["peer"].to_list() == [None]


def _batch_cases() -> dict[str, bytes]:
    """Dumps that differ in every way a batch must keep apart: groups, ops, shapes, p2p, keys
    some entries lack, constants that differ between dumps (equal values of other types),
    JSON, no entries, and the broken ones."""
    def mixed(seq: int) -> dict[str, Any]:
        e = nccl_entry(seq, op="send 0->1" if seq % 3 == 0 else "all_reduce", p2p=seq % 3 == 0,
                       sizes=[[seq % 2 + 1]], pg=("1", "tp") if seq > 4 else ("0", "default_pg"),
                       pg_id=int(seq > 4), state="started" if seq == 7 else "completed")
        if seq % 2:
            e["duration_ms"] = 1.5
        return e

    cases = {
        "nccl_trace_rank_0": nccl_dump([nccl_entry(i) for i in range(1, 40)]),
        "nccl_trace_rank_1": nccl_dump([mixed(i) for i in range(1, 9)]),
        "nccl_trace_rank_2": nccl_dump([nccl_entry(i, timeout_ms=1000) for i in range(1, 30)]),
        # True and 1.0 are equal but read differently: 1.0 is no boolean
        "nccl_trace_rank_3": nccl_dump([nccl_entry(i, retired=1.0) for i in range(1, 5)]),  # type: ignore[arg-type]
        "nccl_trace_rank_4": nccl_dump([nccl_entry(i, retired=True) for i in range(1, 5)]),
        "nccl_trace_rank_5": nccl_dump([{**nccl_entry(1), "state": "done\ud800"}]),
        "nccl_trace_rank_6": nccl_dump([nccl_entry(1, fmt="json")], fmt="json"),
        "nccl_trace_rank_7": nccl_dump([]),
        "nccl_trace_rank_8": b"",
        "nccl_trace_rank_9": nccl_dump([nccl_entry(i, pg=("2", "dp"), pg_id=2)
                                         for i in range(1, 12)]),
        "nccl_trace_rank_10": nccl_dump([nccl_entry(i) for i in range(1, 40)])[:900],
    }
    return cases


@pytest.mark.parametrize("batch", [1, 10, 60, fr.BATCH_ENTRIES])
def test_a_batch_reads_as_its_dumps_one_by_one(batch: int) -> None:
    """A reader builds one frame per batch of dumps; every dump's rows, groups and status are
    what reading it alone gives, and a dump no column can hold fails alone."""
    cases = _batch_cases()
    alone = [fr.read_dump(data, name) for name, data in cases.items()]
    with fr.DumpReader(batch_entries=batch) as reader:
        together = [reader.add(data, name) for name, data in cases.items()]
    for a, b in zip(alone, together, strict=True):
        assert (a.source, a.status, a.error, a.groups) == (b.source, b.status, b.error, b.groups)
        assert a.entries.equals(b.entries), a.source
        assert a._pg_names == b._pg_names
    status = {d.rank: d.status for d in together}
    assert status[5] == "corrupt" and status[10] == "corrupt" and status[8] == "empty"
    assert sum(d.ok for d in together) == 8
    one, many = fr.build_frames(alone), fr.build_frames(together)
    assert one.collectives.equals(many.collectives)
    assert one.groups.equals(many.groups)
    retired = many.collectives.filter(pl.col("rank").is_in([3, 4])).group_by("rank").agg(
        pl.col("retired").unique())
    assert dict(retired.iter_rows()) == {3: [None], 4: [True]}
    rows = many.collectives.filter(pl.col("rank") == 1)
    assert rows["peer"].to_list() == [None, None, 1, None, None, 1, None, None]
    assert rows["pg_name"].to_list() == ["0"] * 4 + ["1"] * 4
    assert rows["duration_ms"].to_list() == [1.5, None] * 4


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_damaged_dumps_never_raise(data: st.DataObject) -> None:
    good = bytearray(nccl_dump([nccl_entry(i, state="completed") for i in range(1, 6)]))
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(good) - 1))
        good[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(good)))
    d = fr.read_dump(bytes(good[:cut]), "nccl_trace_rank_0")
    assert d.status in ("ok", "corrupt", "unsafe", "not_a_dump", "empty")
    if d.ok:
        assert d.entries.schema == pl.Schema(fr.COLLECTIVES_SCHEMA)


# --------------------------------------------------------------------------- recognising


def test_looks_like_dump_claims_dumps_only() -> None:
    assert fr.looks_like_dump(b"", "bundle/fr/nccl_trace_rank_7")  # empty: still a dump
    assert fr.looks_like_dump(b"\x00\x01garbage", "fr/comm_lib_trace_rank_7")
    assert not fr.looks_like_dump(b"", "logs/rank7.log")
    assert not fr.looks_like_dump(b"step 1 loss 0.5\n", "nccl_trace_rank_7")  # text: a log
    pyspy = json.dumps([{"pid": 1, "thread_id": 1, "frames": []}]).encode()
    assert not fr.looks_like_dump(pyspy, "stack.json")
    assert not fr.looks_like_dump(pickle.dumps({"weights": [1, 2]}), "model.pkl")
    assert not fr.looks_like_dump(b'{"schema": "ddp-autopsy/bundle/1"}', "manifest.json")
    big = nccl_dump([nccl_entry(i, fmt="json") for i in range(1, 2000)], fmt="json")
    assert fr.looks_like_dump(big[:65536], "whatever.json")  # markers early, config at the end


@pytest.mark.parametrize(("name", "rank", "host"), [
    ("nccl_trace_rank_0", 0, None),
    ("/tmp/comm_lib_trace_rank_4095", 4095, None),
    ("fr/node-a_rank3", 3, "node-a"),
    ("node-b_rank12.json", 12, "node-b"),
    ("trace_gpu7.cluster.local_15.pkl", 15, "gpu7.cluster.local"),
    ("bundle.tgz!fr/nccl_trace_rank_2", 2, None),
    ("rank6.pkl", 6, None),
    ("dump.pkl", None, None),
])
def test_rank_and_host_from_any_naming(name: str, rank: int | None, host: str | None) -> None:
    assert fr.dump_identity(name) == (rank, host)


def test_one_dump_per_rank_prefers_readable_pickle() -> None:
    pk = fr.read_dump(nccl_dump([nccl_entry(1)]), "a/nccl_trace_rank_0")
    js = fr.read_dump(nccl_dump([nccl_entry(1, fmt="json")], fmt="json"), "b/host_rank0.json")
    empty = fr.read_dump(b"", "c/nccl_trace_rank_0")
    frames = fr.build_frames([js, empty, pk])
    status = dict(zip(frames.dumps["source"], frames.dumps["status"], strict=True))
    assert status == {"b/host_rank0.json": "duplicate", "c/nccl_trace_rank_0": "duplicate",
                      "a/nccl_trace_rank_0": "ok"}
    assert frames.collectives["source"].unique().to_list() == ["a/nccl_trace_rank_0"]
    assert frames.dumps.schema == pl.Schema(fr.DUMPS_SCHEMA)
    assert frames.groups.schema == pl.Schema(fr.GROUPS_SCHEMA)


def test_gloo_config_without_a_name_is_ignored() -> None:
    data = pickle.dumps({"version": "2.10", "pg_config": {"": {"name": "", "desc": "",
                                                               "ranks": "[0, 1, 2]"}},
                         "pg_status": {"0": {"last_enqueued_collective": 3,
                                             "last_started_collective": -1,
                                             "last_completed_collective": 2}},
                         "entries": [nccl_entry(3)]}, protocol=2)
    (group,) = fr.read_dump(data, "nccl_trace_rank_1").groups
    assert group["pg_name"] == "0" and group["members"] is None
    assert (group["last_enqueued"], group["last_completed"]) == (3, 2)


def test_reader_does_not_import_torch() -> None:
    code = ("import sys; from ddp_autopsy.analyzer import flight_recorder, collectives;"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- through job.load


def test_job_load_reads_dumps_next_to_logs(tmp_path: Path) -> None:
    """End to end through ``job.load``: dumps next to logs, any naming, an empty one."""
    from ddp_autopsy.analyzer.job import load

    fr_dir = tmp_path / "fr"
    fr_dir.mkdir()
    (fr_dir / "nccl_trace_rank_0").write_bytes(nccl_dump([nccl_entry(1), nccl_entry(2)]))
    (fr_dir / "node-b_rank1.json").write_bytes(
        nccl_dump([nccl_entry(1, fmt="json")], fmt="json"))
    (fr_dir / "nccl_trace_rank_2").write_bytes(b"")
    (tmp_path / "train.log").write_text("step 1 loss 0.5\n")
    job = load([tmp_path])
    assert job.has("collectives")
    assert sorted(job.collectives["rank"].unique().to_list()) == [0, 1]
    status = dict(zip(job.fr_dumps["rank"], job.fr_dumps["status"], strict=True))
    assert status == {0: "ok", 1: "ok", 2: "empty"}
    assert any("rank 2" in n.message and "empty" in n.message for n in job.notes)
    assert not any(n.path.endswith("nccl_trace_rank_0") for n in job.notes)
    # dumps are not read as logs: no event comes from them
    assert job.events.filter(pl.col("source").str.contains("/fr/")).height == 0


SELF_REFERENCE = r"""
import pickle, sys
from ddp_autopsy.analyzer import flight_recorder as fr
data = next(iter(fr.example_dumps("rank 0: #1 all_reduce [[4]] Float completed | "
                                  "#2 all_reduce [[4]] Float started").values()))
for key in pickle.loads(data)["entries"][0]:
    for shape in ("itself", "in a list"):
        top = pickle.loads(data)
        entry = top["entries"][0]
        entry[key] = entry if shape == "itself" else [entry]
        dump = fr.read_dump(pickle.dumps(top, protocol=2), f"{key} {shape}", rank=0)
        fr.build_frames([dump])
        print(key, shape, dump.status)
"""


def test_a_value_that_contains_itself_is_read_not_crashed_on() -> None:
    """A crafted pickle can make an entry's field hold the entry: polars would recurse into it
    until the process dies (a segfault, not an exception), so the reader must keep containers
    away from it. Run in a child process so that a regression fails this test, not the run."""
    proc = subprocess.run([sys.executable, "-c", SELF_REFERENCE], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    statuses = {line.rsplit(" ", 1)[1] for line in proc.stdout.splitlines()}
    assert statuses <= {"ok", "corrupt"} and len(proc.stdout.splitlines()) >= 30


def test_collectives_frame_is_one_chunk_per_batch() -> None:
    """Neighbouring dumps of one batch become one slice of its frame (fewer chunks for the
    analysis), with the rows the dumps' own entries give, whatever is left out or added."""
    blobs = {f"fr/nccl_trace_rank_{r}": nccl_dump([nccl_entry(i, state="completed")
                                                    for i in range(1, 11 + r)])
             for r in range(12)}
    with fr.DumpReader(batch_entries=60) as reader:
        dumps = [reader.add(b, name) for name, b in blobs.items()]
    other = fr.read_dump(blobs["fr/nccl_trace_rank_3"], "elsewhere/nccl_trace_rank_30")
    for used in (dumps, dumps[:5] + dumps[6:], [*dumps[:4], other, *dumps[4:]]):
        frames = fr.build_frames(used)
        assert frames.collectives.equals(pl.concat([d.entries for d in used]))
        assert frames.collectives.n_chunks() < len(used) / 2
