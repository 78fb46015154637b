"""Many small files are read ahead and sifted many to a batch (``events.Presifter``): the events,
notes and inputs must be exactly those of reading each file on its own.

The input is every log of the rule cases and a fixed sample of the corpus (all of it with
``DDP_AUTOPSY_FULL_CORPUS=1``: test_perf_quick.equivalence_cases), side by side in one directory, plus
files made to take every way out of the batch (no final newline, NUL bytes, byte-order marks,
invalid UTF-8, ANSI colours, py-spy dumps, a Flight Recorder name, an empty file, a file
larger than a batch, a compressed one)."""

from __future__ import annotations

import gzip
import shutil
import threading
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ddp_autopsy.analyzer import events, job

try:
    from tests.test_perf_quick import equivalence_cases
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_perf_quick import equivalence_cases  # type: ignore[no-redef]

ROOT = Path(__file__).parent
PYSPY = (b"Process 4242: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
         b"Thread 4242 (idle): \"MainThread\"\n    wait (threading.py:320)\n")


def _inputs(root: Path) -> Path:
    out = root / "logs"
    out.mkdir()
    n = 0
    for case in equivalence_cases(near_misses=False):
        for f in sorted(case.rglob("*")):
            if f.is_file() and f.name not in ("truth.json", "expect.json", "SOURCE.md"):
                d = out / f"{n:04d}-{case.name}"
                d.mkdir()
                shutil.copy(f, d / f.name)
                n += 1
    odd = out / "odd"
    odd.mkdir()
    oom = b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    (odd / "no-newline.log").write_bytes(oom.rstrip(b"\n"))
    (odd / "nul.log").write_bytes(b"\x00" * 100 + oom)
    (odd / "bom.log").write_bytes(b"\xef\xbb\xbf" + oom)
    (odd / "utf16.log").write_bytes(oom.decode().encode("utf-16"))
    (odd / "latin1.log").write_bytes(b"caf\xe9 " + oom)
    (odd / "ansi.log").write_bytes(b"\x1b[31m" + oom.rstrip(b"\n") + b"\x1b[0m\n"
                                   + b"[rank3]: CUDA out of\x1b[1m memory. Tried to allocate\n")
    (odd / "crlf.log").write_bytes(oom.replace(b"\n", b"\r\n") * 3)
    (odd / "zlib-like.log").write_bytes(b"x^2 is not a header\n" + oom)
    (odd / "stack.txt").write_bytes(PYSPY)
    (odd / "nccl_trace_rank_0").write_bytes(b"")
    (odd / "empty.log").write_bytes(b"")
    (odd / "blank.log").write_bytes(b"\n\n  \n")
    (odd / "big.log").write_bytes(b"step 1 | loss 2.5\n" * (events.SMALL_FILE // 18 + 10) + oom)
    (odd / "gz.log.gz").write_bytes(gzip.compress(oom))
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _inputs(tmp_path_factory.mktemp("batch"))


def _load(path: Path, monkeypatch: pytest.MonkeyPatch, *, presift: bool,
          batch_bytes: int = events.BATCH_BYTES, hyperscan: bool = False) -> job.Job:
    """``path`` loaded, each file on its own or batched; with Hyperscan's filter for every
    block, or polars' for all."""
    with monkeypatch.context() as m:
        m.setattr(job, "PRESIFT_FILES", 2 if presift else 10**9)
        m.setattr(events, "BATCH_BYTES", batch_bytes)
        m.setattr(events, "HYPERSCAN_MIN", 0 if hyperscan else 1 << 62)
        return job.load([path])


def _same(a: job.Job, b: job.Job) -> None:
    assert_frame_equal(a.events, b.events)
    assert [n.to_dict() for n in a.notes] == [n.to_dict() for n in b.notes]
    assert [r.to_dict() for r in a.inputs] == [r.to_dict() for r in b.inputs]


HYPERSCAN = [False, pytest.param(True, marks=pytest.mark.skipif(
    events._hyperscan() is None, reason="Hyperscan not installed (pip install hyperscan)"))]


@pytest.mark.parametrize("hyperscan", HYPERSCAN)
@pytest.mark.parametrize("batch_bytes", [1, 256 << 10, events.BATCH_BYTES])
def test_batched_reading_equals_reading_each_file(inputs: Path, batch_bytes: int, hyperscan: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _load(inputs, monkeypatch, presift=False)
    assert alone.events.height > 500 and len(alone.inputs) > 150
    _same(alone, _load(inputs, monkeypatch, presift=True, batch_bytes=batch_bytes,
                       hyperscan=hyperscan))


@pytest.mark.skipif(events._hyperscan() is None, reason="Hyperscan not installed")
def test_hyperscan_finds_the_lines_polars_finds(inputs: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file alone, its blocks filtered by Hyperscan or by polars (and a file of several
    blocks: big.log, read on the pool)."""
    _same(_load(inputs, monkeypatch, presift=False),
          _load(inputs, monkeypatch, presift=False, hyperscan=True))


def test_every_way_out_of_the_batch_is_taken(inputs: Path) -> None:
    """What a batch cannot read exactly as a file alone is read is left to the caller."""
    files = [(p, lambda p=p: p.open("rb"), p.stat().st_size)
             for p in sorted((inputs / "odd").iterdir())]
    with events.Presifter(files, lambda head, key: not key.name.startswith("stack")) as ahead:
        batched = {p.name for p, _, _ in files if ahead.take(p) is not None}
    assert batched == {"latin1.log", "ansi.log", "crlf.log", "zlib-like.log", "blank.log"}


def test_a_file_grown_since_listing_is_left_to_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "growing.log"
    path.write_bytes(b"line 1\nline 2\n")
    files = [(path, lambda: path.open("rb"), 7)]  # listed when it held one line
    with events.Presifter(files, lambda head, key: True) as ahead:
        assert ahead.take(path) is None
    with events.Presifter([(path, lambda: path.open("rb"), 14)], lambda h, k: True) as ahead:
        assert ahead.take(path) is not None


def test_batches_not_started_are_cancelled_when_left_early(inputs: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "BATCH_BYTES", 1)  # a batch per file
    files = [(p, lambda p=p: p.open("rb"), p.stat().st_size)
             for p in sorted(inputs.rglob("*.log"))]
    assert len(files) > 10
    with events.Presifter(files, lambda head, key: True) as ahead:
        assert ahead.take(files[0][0]) is not None
        assert len(ahead._running) == events.AHEAD + 1  # no more read ahead than that
        running = [fut for _, fut in ahead._running]
    assert not ahead._running and not ahead._batches
    assert all(fut.cancelled() or fut.done() for fut in running)


def test_latin1_batch_is_noted_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invalid UTF-8 in one file of a batch: only that file is noted."""
    for i in range(6):
        (tmp_path / f"{i}.log").write_bytes(b"ok line\n" if i != 3 else b"caf\xe9\n")
    loaded = _load(tmp_path, monkeypatch, presift=True)
    assert [n.path.rsplit("/", 1)[-1] for n in loaded.notes] == ["3.log"]
    assert pl.DataFrame([r.to_dict() for r in loaded.inputs])["lines"].to_list() == [1] * 6


@pytest.mark.skipif(events._hyperscan() is None, reason="Hyperscan not installed")
def test_hyperscan_lists_each_candidates_needles(inputs: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The needles Hyperscan reports on each candidate line (its match ids, line numbers from
    the frame's line lengths, or counted in the bytes of CRLF files) are those the substring
    tests find: every file alone, and all of them as one batch."""
    monkeypatch.setattr(events, "HYPERSCAN_MIN", 0)
    datas = [f.read_bytes() for f in sorted(inputs.rglob("*"))
             if f.is_file() and f.suffix != ".gz" and f.name != "stack.txt"]
    datas = [d for d in datas if d.endswith(b"\n") and events._utf8(d)]
    batch = events._sift_batch(datas)
    checked = crlf = quick = 0
    for data, alone in zip(datas, batch, strict=True):
        for sifted in (events._sift(data, True), alone):
            if sifted.found is None:  # ANSI colours, boxes: polars' filter
                continue
            crlf += b"\r\n" in data
            if sifted.frame is None:  # events._sift_quick: no frame, its rows only
                lines = data.decode().split("\n")
                expected = [(i, text, frozenset(n for n in events._NEEDLE_LIST if n in text))
                            for i, text in enumerate(lines) if any(n in text for n in
                                                                   events.NEEDLES)]
                assert sifted.rows == expected
                quick += 1
            else:
                expected = list(events._found(sifted.candidates))
                assert list(events._found(sifted.candidates, sifted.found)) == expected
                lines = sifted.frame["text"].to_list()
            assert all(lines[line - sifted.base] == raw for line, raw, _ in expected)
            checked += len(expected)
    assert checked > 1000 and crlf and quick


def test_batched_files_are_classified_on_the_pool(inputs: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """job.load gives the Presifter each file's context: the caller's thread only collects the
    events of the files a batch read (its classification ran on the pool, both cores)."""
    where: dict[str, set[str]] = {}
    scan = events._scan

    def recording(fh, ctx, notes, stats, presifted, report):  # type: ignore[no-untyped-def]
        where.setdefault(threading.current_thread().name.split("_")[0], set()).add(ctx.display)
        return scan(fh, ctx, notes, stats, presifted, report)

    monkeypatch.setattr(events, "_scan", recording)
    loaded = _load(inputs, monkeypatch, presift=True)
    pooled = where.get("ddp-autopsy-sift", set())
    assert len(pooled) > 150  # the corpus' and the cases' logs
    # The caller read only what a batch cannot (the odd files, the big one, ...).
    alone = {Path(d) for d in where.get("MainThread", set())}
    assert {"no-newline.log", "big.log", "gz.log.gz"} <= {p.name for p in alone}
    for path in alone:
        data = path.read_bytes()
        assert path.suffix == ".gz" or len(data) > events.SMALL_FILE \
            or not data.endswith(b"\n") or b"\x00" in data \
            or data.startswith((b"\xef\xbb\xbf", b"\xff\xfe")), path
    assert loaded.events.height > 500


def test_a_context_unlike_the_callers_is_classified_again(tmp_path: Path) -> None:
    """Events classified on the pool are used only for the very context the caller gives;
    another context (here: another rank from the bundle manifest) is classified anew."""
    log = tmp_path / "rank3.log"
    log.write_bytes(b"step 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                    b"2.00 GiB\nstep 2\n")
    files = [(log, lambda: log.open("rb"), log.stat().st_size)]

    def ctx(rank: int | None) -> events.FileContext:
        return events.FileContext(str(log), 2026, rank=rank, cue="test" if rank else None)

    with events.Presifter(files, lambda head, key: True, lambda key: ctx(None)) as ahead:
        presifted = ahead.take(log)
    assert presifted is not None and isinstance(presifted[1], events._Scanned)
    for rank in (None, 3):
        notes: list[events.InputNote] = []
        got = events.scan_text(None, ctx(rank), notes, presifted=presifted)
        with log.open("rb") as fh:
            alone = events.scan_text(fh, ctx(rank), [])
        assert got == alone and {e["rank"] for e in got if e["kind"] == "oom"} == {rank}


def test_tiny_blocks_keep_the_lines_the_filters_keep(inputs: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of a few KB is filtered by substring tests in Python (no regex to compile):
    the same candidate lines as polars' two-level filter, on every log of the inputs."""
    checked = 0
    for path in sorted(inputs.rglob("*")):
        if not path.is_file() or path.suffix == ".gz":
            continue
        with path.open("rb") as fh:
            blocks = list(events.iter_blocks(fh, str(path), []))
        for block in blocks:
            frame, replaced = events._lines(block)
            got = []
            for tiny in (0, 1 << 62):
                monkeypatch.setattr(events, "TINY_BLOCK", tiny)
                monkeypatch.setattr(events, "HYPERSCAN_MIN", 1 << 62)
                got.append(events._candidates(frame, block, replaced)[0])
            assert_frame_equal(got[0], got[1])
            checked += got[0].height
    assert checked > 1000
