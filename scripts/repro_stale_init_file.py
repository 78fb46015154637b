"""Reproduce a relaunch over a stale ``file://`` init file, and keep the logs of a failing try.

A first run (2 ranks, Gloo, ``init_method=file://…``) is SIGKILLed after init, leaving its
FileStore file with its Gloo addresses. The relaunch starts rank 1 at once and rank 0 late, and
prints its init URL the way torchvision's reference scripts do.

Whether the relaunch fails is not deterministic, which is why this is a script and not a test
scenario: for each pair of ranks one side connects and the other waits for it (Gloo decides by
comparing the two listening addresses, which on one host means the two random ports). When
rank 1 is the side that connects, it reads the killed run's address of rank 0, is refused and
gives up (``Gloo connectFullMesh failed … Connection refused``); when it is the side that waits,
rank 0 later reads rank 1's fresh address and the job runs. About half the tries fail.

    python scripts/repro_stale_init_file.py OUT_DIR [--tries 8]

writes ``OUT_DIR/rank0.log`` and ``OUT_DIR/rank1.log`` of the first failing try; the fixture
``tests/rules/cases/RDZV005`` was made this way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREVIOUS_RUN = """
import sys, time, torch, torch.distributed as dist
path, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2)
dist.all_reduce(torch.ones(1))
open(f"{path}.joined{rank}", "w").close()
time.sleep(300)
"""

RELAUNCH = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
path, rank, late_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
dist_url = "file://" + path
if rank == 0:
    time.sleep(late_s)  # its node comes up late
print(f"| distributed init (rank {rank}): {dist_url}", flush=True)
dist.init_process_group("gloo", init_method=dist_url, rank=rank, world_size=2,
                        timeout=timedelta(seconds=20))
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank={rank} sum={t.item()}", flush=True)
dist.destroy_process_group()
"""


def leave_stale_file(init_file: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", PREVIOUS_RUN, str(init_file), str(r)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in range(2)]
    try:
        deadline = time.monotonic() + 60
        while not all(Path(f"{init_file}.joined{r}").exists() for r in range(2)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("the first run did not start")
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def relaunch(init_file: Path, out: Path, late_s: float) -> bool:
    """One relaunch; True when rank 1 failed (the logs are in ``out``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = []
    for rank in (1, 0):
        with (out / f"rank{rank}.log").open("wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RELAUNCH, str(init_file), str(rank), str(late_s)],
                stdout=log, stderr=subprocess.STDOUT, env=env))
    with contextlib.suppress(subprocess.TimeoutExpired):
        procs[0].wait(timeout=60)
    time.sleep(late_s + 4)  # rank 0 comes up and waits in init_process_group: stopped there
    for proc in procs:
        proc.kill()
        proc.wait()
    return procs[0].returncode not in (0, None, -9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tries", type=int, default=8)
    ap.add_argument("--late", type=float, default=8.0, help="seconds rank 0 starts late")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, args.tries + 1):
        with tempfile.TemporaryDirectory() as tmp:
            init_file = Path(tmp) / "dist_init"
            leave_stale_file(init_file)
            failed = relaunch(init_file, args.out, args.late)
        print(f"try {attempt}: {'rank 1 failed' if failed else 'the relaunch ran'}", flush=True)
        if failed:
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
