"""Benchmark ``collect`` on a real hung job (run on demand, not in CI).

    python benchmarks/bench_collect.py --ranks 8
    python benchmarks/bench_collect.py --ranks 8 --workers 7     # 8 ranks + 56 DataLoader workers

Starts a torchrun job whose ranks all block (rank 1 in ``evaluate()``, the rest in all_reduce),
each rank optionally holding a live DataLoader with N workers, plus one "heartbeat" thread per
rank that increments a counter file every 10 ms. It then runs ``collect`` (default, non-blocking
py-spy) and reports: wall time, processes collected, stacks taken, and whether the heartbeat
kept going during the collection (the job was not paused).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = '''
import os, sys, threading, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist

def beat(path):
    n = 0
    tmp = path.with_suffix(".tmp")
    while True:
        n += 1
        tmp.write_text(str(n))
        os.replace(tmp, path)  # atomic: the reader never sees a half-written number
        time.sleep(0.01)

def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    out = Path(os.environ["BENCH_DIR"])
    workers = int(os.environ["BENCH_WORKERS"])
    it = None
    if workers:
        data = torch.utils.data.TensorDataset(torch.arange(64.0))
        it = iter(torch.utils.data.DataLoader(data, batch_size=2, num_workers=workers,
                                              persistent_workers=True))
        next(it)
    threading.Thread(target=beat, args=(out / f"beat{rank}",), daemon=True).start()
    (out / f"ready{rank}").write_text(str(os.getpid()))
    if rank == 1:
        while True:
            time.sleep(0.5)
    dist.all_reduce(torch.ones(1))

main()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    args = ap.parse_args()
    from ddp_autopsy.collectors import CollectOptions, collect
    from ddp_autopsy.demo import stop_job

    tmp = Path(tempfile.mkdtemp(prefix="bench-collect-"))
    (tmp / "job.py").write_text(JOB)
    env = {**os.environ, "BENCH_DIR": str(tmp), "BENCH_WORKERS": str(args.workers),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.ranks}",
         f"--master-port={_free_port()}", str(tmp / "job.py")],
        stdout=(tmp / "console.log").open("wb"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp.glob("ready*"))) < args.ranks:
            if time.monotonic() > deadline or proc.poll() is not None:
                print((tmp / "console.log").read_text()[-2000:])
                return 1
            time.sleep(0.2)
        time.sleep(1.0)
        beats_before = {p.name: int(p.read_text()) for p in tmp.glob("beat*[0-9]")}
        t0 = time.perf_counter()
        result = collect(CollectOptions(pid=proc.pid, out=tmp / "bundle", deadline_s=120))
        wall = time.perf_counter() - t0
        beats_after = {p.name: int(p.read_text()) for p in tmp.glob("beat*[0-9]")}
    finally:
        stop_job(proc, grace_s=5)
    procs = result.manifest["processes"]
    stacks = sum(p.get("stack_status") == "ok" for p in procs)
    expected = wall / 0.01
    progress = min(beats_after[k] - beats_before[k] for k in beats_before)
    print(json.dumps({
        "ranks": args.ranks, "dataloader_workers_per_rank": args.workers,
        "processes": len(procs), "stacks_ok": stacks, "collect_wall_s": round(wall, 2),
        "heartbeats_during_collect_min": progress,
        "heartbeats_if_never_paused": round(expected),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
