"""Flight Recorder at scale: ddp-autopsy vs torch's fr_trace on the same dumps.

Writes one dump per rank in torch's pickle format (version 2.10, with call stacks, shared frame
dicts memoised as torch's pickler does, NCCL-style ``pg_config`` so that fr_trace can run), for
a hung job: every rank issued ``ENTRIES`` collectives on the default group, except one rank that
skipped the last one. Then times, in fresh processes:

* ``ddp-autopsy``: read every dump, build the frames, run the per-group analysis
  (``collectives.analyze_frames``), in one process: with the native reader (``_frpickle``)
  when it is built, its thread parsing files ahead of the caller (``fr_reader.read_native``),
  and with ``--python-reader`` also without it (``DDP_AUTOPSY_FR_NATIVE=0``: Python's
  unpickler, and a helper process that reads half of the dumps);
* ``fr_trace``: ``python -m torch.distributed.flight_recorder.fr_trace DIR`` (needs torch).

Both run in the same minute, one after the other, on the same files; each row reports the
speed-up (fr_trace's time over ours) in wall time and in CPU time (user + sys, which other work
on a shared machine inflates less), and the machine's load average before each run.

    python benchmarks/bench_fr.py                        # 256 and 1024 ranks, side by side
    python benchmarks/bench_fr.py --ranks 1024 --entries 2000
    python benchmarks/bench_fr.py --ranks 4096 --entries 2000 --fr-trace-timeout 3600
    python benchmarks/bench_fr.py --ranks 1024 --no-fr-trace --breakdown 300   # ms per step
    python benchmarks/bench_fr.py --python-reader   # also ours with Python's unpickler only

Figures are in docs/performance-fr.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FRAMES = [
    {"name": "all_reduce", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/"
                                       "distributed_c10d.py", "line": 3245},
    {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/"
                                    "c10d_logger.py", "line": 83},
    {"name": "reduce_grads", "filename": "/work/train/model.py", "line": 88},
    {"name": "train_step", "filename": "/work/train/train.py", "line": 141},
    {"name": "train", "filename": "/work/train/train.py", "line": 210},
    {"name": "main", "filename": "/work/train/train.py", "line": 260},
    {"name": "<module>", "filename": "/work/train/train.py", "line": 266},
]
T0 = 1_790_000_000_000_000_000


def make_dump(rank: int, ranks: int, entries: int, culprit: int) -> dict[str, Any]:
    frames = [dict(f) for f in FRAMES]  # one set per file: memoised like torch's pickler
    n = entries - 1 if rank == culprit else entries
    out = []
    for i in range(n):
        seq = i + 1
        last = seq == entries
        out.append({
            "frames": frames[:],
            "record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": "nccl:all_reduce", "time_created_ns": T0 + seq * 50_000_000,
            "input_sizes": [[1024, 1024]], "input_dtypes": ["Float"],
            "output_sizes": [[1024, 1024]], "output_dtypes": ["Float"],
            "state": "started" if last else "completed",
            "time_discovered_started_ns": T0 + seq * 50_000_000 + 1000,
            "time_discovered_completed_ns": None if last else T0 + seq * 50_000_000 + 9000,
            "retired": last, "timeout_ms": 600_000, "is_p2p": False,
            "thread_id": "140354913500032", "thread_name": "pt_main_thread",
        })
    done = entries - 1
    return {
        "version": "2.10", "comm_lib_version": "2.27.3",
        "pg_config": {"0": {"name": "0", "desc": "default_pg",
                            "ranks": str(list(range(ranks)))}},
        "pg_status": {"0": {"last_enqueued_collective": n, "last_started_collective": n,
                            "last_completed_collective": done if rank != culprit else n}},
        "entries": out,
    }


def generate(directory: Path, ranks: int, entries: int, culprit: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        path = directory / f"nccl_trace_rank_{r}"
        if path.exists():
            continue
        with path.open("wb") as fh:
            pickle.dump(make_dump(r, ranks, entries, culprit), fh, protocol=2)


OURS = r"""
import json, sys, time, resource, glob
t0 = time.perf_counter()
from ddp_autopsy.analyzer import collectives, flight_recorder as fr, fr_reader
paths = sorted(glob.glob(sys.argv[1] + "/nccl_trace_rank_*"))
dumps = fr_reader.read_paths(paths)
frames = fr.build_frames(dumps)
del dumps
t1 = time.perf_counter()
report = collectives.analyze_frames(frames)
t2 = time.perf_counter()
g = report.groups[0]
usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
rss = max(u.ru_maxrss for u in usage) / 1024
cpu = sum(u.ru_utime + u.ru_stime for u in usage)
print(json.dumps({"read_s": round(t1 - t0, 2), "analyze_s": round(t2 - t1, 2),
                  "total_s": round(t2 - t0, 2), "cpu_s": round(cpu, 2),
                  "rows": frames.collectives.height,
                  "not_joined": sorted(g.not_joined), "stuck_at": g.stuck_at,
                  "rss_mb": round(rss)}))
"""


BREAKDOWN = r"""
import gc, glob, json, statistics, sys, time
from ddp_autopsy.analyzer import flight_recorder as fr
paths = sorted(glob.glob(sys.argv[1] + "/nccl_trace_rank_*"))[: int(sys.argv[2])]
native = fr.native_available()
names = (["read file", "native parse", "runs (Python)", "frame (polars)"] if native else
         ["read file", "unpickle", "entries -> columns", "free"])
steps = {k: [] for k in [*names, "total"]}
keep = []
T = time.process_time_ns  # CPU time: other work on the machine does not inflate it
for p in paths:
    t0 = T()
    with open(p, "rb") as fh:
        data = fh.read()
    t1 = T()
    gc.disable()
    dump = fr.FRDump(source=p, rank=fr.dump_identity(p)[0], host=None, format="pickle",
                     status="ok")
    if native:
        parsed = fr._parse_native(data)
        t2 = T()
        runs, rows = fr._read_native(dump, parsed)
        t3 = T()
        fr._tabulate([(dump, runs, rows)])
        del parsed, data
    else:
        obj = fr.unpickle_plain(data)
        t2 = T()
        fr._fill(dump, obj)
        t3 = T()
        del obj, data
    t4 = T()
    gc.enable()
    keep.append(dump)  # kept, as read_paths keeps them: their memory is new each time
    for k, a, b in zip(names + ["total"], (t0, t1, t2, t3, t0), (t1, t2, t3, t4, t4)):
        steps[k].append((b - a) / 1e6)
print(json.dumps({k: round(statistics.median(v), 2) for k, v in steps.items()}))
"""


def _env(native: bool) -> dict[str, str]:
    return {**os.environ, "DDP_AUTOPSY_FR_NATIVE": "1" if native else "0"}


def run_breakdown(directory: Path, dumps: int, native: bool = True) -> dict[str, Any]:
    """Median CPU milliseconds per dump for each step of reading (one dump at a time, so the
    frame step is not batched as in ``read_paths``)."""
    out = subprocess.run([sys.executable, "-c", BREAKDOWN, str(directory), str(dumps)],
                         capture_output=True, text=True, check=True, env=_env(native))
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ours(directory: Path, native: bool = True) -> dict[str, Any]:
    """ddp-autopsy in a fresh process; ``native=False`` reads with Python's unpickler only."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", OURS, str(directory)],
                         capture_output=True, text=True, check=True, env=_env(native))
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["wall_s"] = time.perf_counter() - t
    return res


def run_fr_trace(directory: Path, timeout: float, max_gb: float) -> dict[str, Any]:
    """fr_trace in a child limited to ``max_gb`` of address space (on a shared machine a
    MemoryError is better than the OOM killer)."""
    limit = int(max_gb * (1 << 30))

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t = time.perf_counter()
    try:
        out = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KB %M CPU_S %U %S", sys.executable,
                              "-m",
                              "torch.distributed.flight_recorder.fr_trace", str(directory)],
                             capture_output=True, text=True, timeout=timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return {"wall_s": None, "status": f"timeout after {timeout:.0f}s"}
    wall = time.perf_counter() - t
    text = out.stdout + out.stderr
    stats = next((ln.split() for ln in text.splitlines() if ln.startswith("MAXRSS_KB")), [])
    rss = int(stats[1]) if stats else 0
    cpu = float(stats[3]) + float(stats[4]) if stats else None
    lines = [ln for ln in text.splitlines() if "NumPy" not in ln and "_conversion" not in ln
             and "tabulate" not in ln and not ln.startswith(("expected ranks", "MAXRSS_KB"))]
    return {"wall_s": round(wall, 2), "cpu_s": cpu, "status": f"exit {out.returncode}",
            "output": lines[:7], "tail": lines[-2:], "rss_mb": round(rss / 1024)}


def speedup(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    """fr_trace's time over ours, wall and CPU (None when fr_trace did not finish)."""
    out: dict[str, float | None] = {}
    for key, mine, other in (("wall", ours.get("wall_s"), theirs.get("wall_s")),
                             ("cpu", ours.get("cpu_s"), theirs.get("cpu_s"))):
        out[key] = round(other / mine, 1) if mine and other else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--dir", type=Path, default=None, help="keep dumps here (default: a temp dir)")
    ap.add_argument("--no-fr-trace", action="store_true")
    ap.add_argument("--fr-trace-timeout", type=float, default=3600)
    ap.add_argument("--fr-trace-max-gb", type=float, default=17)
    ap.add_argument("--breakdown", type=int, default=0, metavar="N",
                    help="also time each step of reading for the first N dumps (ms per dump)")
    ap.add_argument("--python-reader", action="store_true",
                    help="also run ddp-autopsy with Python's unpickler only (the reader before "
                         "the native one), in the same run")
    args = ap.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench_fr_"))
    results = []
    try:
        for ranks in args.ranks:
            d = base / f"r{ranks}_e{args.entries}"
            culprit = ranks // 2 + 3
            t = time.perf_counter()
            generate(d, ranks, args.entries, culprit)
            size = sum(p.stat().st_size for p in d.iterdir())
            row: dict[str, Any] = {"ranks": ranks, "entries": args.entries, "culprit": culprit,
                                   "bytes": size, "generate_s": round(time.perf_counter() - t)}
            row["load_before"] = round(os.getloadavg()[0], 2)
            row["ours"] = run_ours(d)
            if args.python_reader:
                row["ours_python_reader"] = run_ours(d, native=False)
            if args.breakdown:
                row["breakdown_ms"] = run_breakdown(d, args.breakdown)
                if args.python_reader:
                    row["breakdown_python_reader_ms"] = run_breakdown(d, args.breakdown, False)
            if not args.no_fr_trace:
                row["load_before_fr_trace"] = round(os.getloadavg()[0], 2)
                row["fr_trace"] = run_fr_trace(d, args.fr_trace_timeout, args.fr_trace_max_gb)
                row["speedup"] = speedup(row["ours"], row["fr_trace"])
            print(json.dumps(row), flush=True)
            results.append(row)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
