"""A file's first block is sifted without polars when it is the common one
(``events._sift_quick``: ASCII, no CR, no ANSI escape, no prefix on its first lines, no failure
summary): the events, notes and inputs must be exactly those of polars' reading, for every log
of the rule cases, a fixed sample of the corpus (all of it with DDP_AUTOPSY_FULL_CORPUS=1) and
large files made to take each way out of it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from ddp_autopsy.analyzer import events, job, lines

ROOT = Path(__file__).parent
NCCL = "gpu-node{h:04d}:{pid}:{pid} [{d}] NCCL INFO Channel {c:02d}/0 : 3[3] -> 4[4] via P2P/IPC\n"
WATCHDOG = ("[rank3]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=3810, OpType=ALLREDUCE, NumelIn=7, "
            "NumelOut=7, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")
INIT = ("gpu-node0000:200035:200076 [5] NCCL INFO ncclCommInitRank comm 0x55d0a8e11000 rank 5 "
        "nranks 8 cudaDev 5 nvmlDev 5 busId 6d000 commId 0x5f3a9c21d0e4b7a8 - Init START\n")


def _nccl(n: int, seed: int = 0) -> str:
    return "".join(NCCL.format(h=seed, pid=1000 + seed, d=i % 8, c=i % 100) for i in range(n))


def _big(body: str, head: str = "", tail: str = "") -> bytes:
    """``head``, then NCCL INFO lines to well past a Hyperscan block's minimum, ``body``,
    more of them, ``tail``."""
    return (head + INIT + _nccl(2500) + body + _nccl(2500, 1) + tail).encode()


#: The reading-equivalence tests (here, test_perf_workers, test_perf_batch) read every rule
#: case and, in CI, every third corpus case (sorted by name: a fixed sample, ~400 of ~1,200);
#: ``DDP_AUTOPSY_FULL_CORPUS=1`` reads the whole corpus (on demand: it costs ~2.5 min more).
FULL_CORPUS = os.environ.get("DDP_AUTOPSY_FULL_CORPUS") == "1"


def equivalence_cases(*, near_misses: bool = True) -> list[Path]:
    """The case folders whose logs the reading-equivalence tests read (see FULL_CORPUS)."""
    corpus = sorted(ROOT.glob("corpus/*/"))
    if not FULL_CORPUS:
        corpus = corpus[::3]
    rules = [*ROOT.glob("rules/cases/*/"), *(ROOT.glob("rules/near_miss/*/") if near_misses
                                              else ())]
    return sorted([*corpus, *rules])


def _inputs(root: Path) -> Path:
    out = root / "logs"
    out.mkdir()
    n = 0
    for case in equivalence_cases():
        for f in sorted(case.rglob("*")):
            if f.is_file() and f.name not in ("truth.json", "expect.json", "SOURCE.md"):
                d = out / f"{n:04d}-{case.name}"
                d.mkdir()
                d.joinpath(f.name).write_bytes(f.read_bytes())
                n += 1
    big = out / "big"
    big.mkdir()
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    files = {
        "plain.log": _big(oom, tail=WATCHDOG),
        "prefixed.log": _big(oom, head="[rank3]: starting\n"),  # a prefix among the first lines
        "prefix-late.log": _big(oom, tail="[rank3]: " + oom),  # past the first 2,000 lines
        "stamp.log": _big(oom, head="2024-05-01 10:11:12 [rank0]: starting\n"),
        "stamp-only.log": _big(oom, head="2024-05-01 10:11:12 starting\n"),  # no prefix
        "maybe-not.log": _big(oom, head="Epoch 1 starting\n/x/y.py:3: UserWarning: z\n"),
        "long-lines.log": ("x" * 1000 + ":y\n").encode() * 600 + _big(oom),
        "summary.log": _big("[W] torch.distributed.elastic.multiprocessing.api: failed\n"
                            "Root Cause (first observed failure):\n[0]:\n"
                            "  time      : 2024-05-01_10:11:12\n  rank      : 3 (local_rank: 3)\n"
                            "  exitcode  : 1 (pid: 42)\n"),
        "wrapped.log": _big("torch.OutOfMemoryError: CUDA out of memory. Tried to\n"
                            "allocate 2.00 GiB\n"),
        "traceback.log": _big('Traceback (most recent call last):\n  File "t.py", line 3, in '
                              "<module>\n    main()\nRuntimeError: NCCL error: unhandled "
                              "system error\n"),
        "self-named.log": _big(oom, tail="rank 3: saving checkpoint\nrank=4 step 7\n"
                                         "Rank 5 | done\nglobal_rank 6: waiting\n"),
        "self-named-early.log": _big(oom, head="rank 2: hello\n"),
        "blank-tail.log": _big(oom, tail="\n" * 80 + "  \t\n" * 10),
        "few-blank-tail.log": _big(oom, tail="\n" * 20 + "  \t\n" * 10),
        "all-blank-tail.log": _big(oom, tail="last words\n" + "\n" * 70),
        "unterminated.log": _big(oom, tail="the end, unterminated"),
        "crlf.log": _big(oom).replace(b"\n", b"\r\n"),
        "ansi.log": _big("\x1b[31m" + oom),
        "utf8.log": _big("progress █████ 50%\n" + oom),
        "latin1.log": _big(oom) + b"caf\xe9\n",
        "needles-only.log": ("NCCL WARN " + oom) .encode() * 40_000,
        "zlib-like.log": _big(oom, head="x^2 is not a header\n"),  # polars would decompress it
    }
    for name, data in files.items():
        big.joinpath(name).write_bytes(data)
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _inputs(tmp_path_factory.mktemp("quick"))


def _load(path: Path, monkeypatch: pytest.MonkeyPatch, *, quick: bool, presift: bool,
          numpy: bool = True) -> tuple[job.Job, list[int]]:
    """``path`` loaded with Hyperscan for every block, the quick sifting allowed or not (its
    newlines counted by numpy or by ``bytes.count``); and the sizes of the blocks it took."""
    taken: list[int] = []
    sift_quick = events._sift_quick

    def recording(block: bytes) -> events._Sifted | None:
        got = sift_quick(block) if quick else None
        if got is not None:
            taken.append(len(block))
        return got

    with monkeypatch.context() as m:
        m.setattr(events, "HYPERSCAN_MIN", 0)
        m.setattr(events, "QUICK_MIN", 0)
        m.setattr(events, "_np", None if numpy else False)
        m.setattr(events, "NUMPY_AFTER", 0)
        m.setattr(events, "_sift_quick", recording)
        m.setattr(job, "PRESIFT_FILES", 2 if presift else 10**9)
        m.setattr(events, "PROCESS_FILES", 10**9)  # in this process: see test_perf_workers.py
        return job.load([path]), taken


pytestmark = pytest.mark.skipif(events._hyperscan() is None, reason="Hyperscan not installed")


@pytest.mark.parametrize(("presift", "numpy"), [(False, True), (True, True), (False, False)])
def test_quick_sifting_equals_polars(inputs: Path, presift: bool, numpy: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    slow, none = _load(inputs, monkeypatch, quick=False, presift=presift)
    fast, taken = _load(inputs, monkeypatch, quick=True, presift=presift, numpy=numpy)
    assert not none and len(taken) > (200 if not presift else 10) and slow.events.height > 500
    assert_frame_equal(slow.events, fast.events)
    assert [n.to_dict() for n in slow.notes] == [n.to_dict() for n in fast.notes]
    assert [r.to_dict() for r in slow.inputs] == [r.to_dict() for r in fast.inputs]


def test_quick_sifting_takes_the_common_file_only(inputs: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Which of the large files are sifted without polars (the rest: polars, as before), and
    what it gives for each block it takes: polars' candidates, last lines and line count."""
    quick = set()
    for path in sorted((inputs / "big").iterdir()):
        data = path.read_bytes()
        got = events._sift_quick(data)
        if got is None:
            continue
        quick.add(path.name)
        with monkeypatch.context() as m:
            m.setattr(events, "_sift_quick", lambda block: None)
            slow = events._sift(data, True)
        assert (got.rows, got.tails, got.lines, got.prefix) == \
            (slow.rows, slow.tails, slow.lines, slow.prefix), path.name
    assert quick == {"plain.log", "prefix-late.log", "stamp-only.log", "maybe-not.log",
                     "wrapped.log", "traceback.log", "self-named.log", "self-named-early.log",
                     "few-blank-tail.log", "unterminated.log", "needles-only.log",
                     "zlib-like.log"}


def _lines(root: Path) -> list[str]:
    out = set()
    for f in root.rglob("*"):
        if f.is_file():
            out.update(f.read_bytes().decode("utf-8", "replace").splitlines())
    return sorted(out)


def test_every_line_a_prefix_may_open_is_looked_at(inputs: Path) -> None:
    """events.MAYBE_PREFIXED matches every line lines.ANY_PREFIX matches (it may match more):
    the lines of the corpus and the cases, and prefixes of each kind lines.py reads."""
    any_prefix = re.compile(lines._ANY_PREFIX)
    maybe = re.compile(events.MAYBE_PREFIXED.decode())
    made = ["[rank3]: x", "  17: x", "[3]: x", "node1: x", "web-1  | x", "> x", "E   x", "E",
            "2024-05-01 10:11:12 x", "2024-05-01T10:11:12.123+00:00 [rank0]: x",
            "[default0]: x", "[RANK 4] x", "[1,0]<stdout>: x", "(pid=42) x",
            "(RayWorker pid=42, ip=10.0.0.1) x", "[pod/train-0/x] x", "host-1: [rank2]:x",
            "a.b_c-d: x", "E1218 x", " | x", "\t| x"]
    tried = 0
    for text in [*_lines(inputs), *made]:
        if any_prefix.match(text):
            assert maybe.match(text), text
            tried += 1
    assert tried > 1000
    # and lines it tells apart: NCCL's, which no prefix opens
    assert not maybe.match("gpu-node0112:206293:206293 [3] NCCL INFO Using network IB")


def test_a_small_file_needs_no_hyperscan(tmp_path: Path) -> None:
    """Hyperscan (its import, its databases: ~50 ms and ~30 MB) only for large blocks."""
    import subprocess
    import sys

    log = tmp_path / "ten.log"
    log.write_text("step 1\n[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to "
                   "allocate 2.00 GiB\n" * 5)
    code = ("import sys; from ddp_autopsy.analyzer.job import load; load([sys.argv[1]]); "
            "print(sorted({'hyperscan', 'numpy', 'ddp_autopsy.analyzer.workers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_hyperscan_databases_are_kept_between_runs(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled once (~50 ms), then read from the user's cache directory (~0.1 ms); a cache
    file cut short or corrupt is compiled anew; the databases find the same either way."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    block = _big("torch.OutOfMemoryError: CUDA out of memory. Tried\n", tail="rank 3: bye\n")

    def fresh() -> tuple[events._Sifted | None, int]:
        compiled = 0
        compile_ = events._compiled_databases

        def counting(*args: object) -> tuple[object, object]:
            nonlocal compiled
            compiled += 1
            return compile_(*args)  # type: ignore[arg-type]

        with monkeypatch.context() as m:
            for name in ("_hs", "_hs_db", "_hs_maybe"):
                m.setattr(events, name, None)
            m.setattr(events, "_hs_local", type(events._hs_local)())
            m.setattr(events, "_compiled_databases", counting)
            return events._sift_quick(block), compiled

    first, compiled = fresh()
    assert compiled == 1 and first is not None and first.rows
    [kept] = (tmp_path / "ddp-autopsy").iterdir()
    again, compiled = fresh()
    assert compiled == 0 and again == first
    for bad in (kept.read_bytes()[:1000], b"\0" * 64, b""):
        kept.write_bytes(bad)
        again, compiled = fresh()
        assert compiled == 1 and again == first
    monkeypatch.setenv("DDP_AUTOPSY_CACHE", "0")
    kept.unlink()
    again, compiled = fresh()
    assert compiled == 1 and again == first and not kept.exists()


@pytest.mark.parametrize("numpy", [False, True])
def test_the_sample_end_is_where_the_sample_lines_end(numpy: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``_sample_end`` (the workers' prefix probe reads up to it): after the SAMPLE_LINES-th
    newline, or the block's size with fewer lines, by numpy or not, lines short or long."""
    import random

    if numpy:
        np = pytest.importorskip("numpy")
    monkeypatch.setattr(events, "_np", np if numpy else False)
    rng = random.Random(18)
    n = events.SAMPLE_LINES
    for count in (0, 1, n - 1, n, n + 1, 3 * n):
        for width in (0, 40, 400):
            block = b"\n".join(b"x" * rng.randint(0, width) for _ in range(count)) \
                + rng.choice([b"", b"\n"])
            newlines = [i for i, c in enumerate(block) if c == 10]
            want = newlines[n - 1] + 1 if len(newlines) >= n else len(block)
            assert events._sample_end(block) == want, (count, width)
