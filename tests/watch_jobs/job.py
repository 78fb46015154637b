"""Real Gloo jobs (CPU) for the watch tests: train a few steps, then misbehave.

Run under torchrun (RANK from the environment) or with ``--spawn N`` (torch.multiprocessing).
Each rank prints ``step=N rank=R`` per step and ``HANG_START rank=R t=<epoch>`` when it enters
the failure (the tests measure detection latency from there; the watcher never reads it).

``--faulthandler``: every rank registers ``faulthandler`` on SIGUSR1 (all threads, to stderr),
the way a job makes its stacks readable when py-spy cannot read them (the fallback tests).

Modes:
  dataloader  rank 1 blocks in its DataLoader's ``__getitem__``; the others wait in all_reduce
  barrier0    rank 0 alone calls ``dist.barrier()``; the others go on to the next all_reduce
  deadlock    two process groups taken in opposite order: every rank waits in all_reduce
  crash       rank 1 raises an exception at step 3
  quiet       healthy: every rank evaluates (sleeps, prints nothing) ``--quiet-s`` seconds,
              twice, between training steps, then the job ends with exit code 0
  healthy     (benchmarks) trains for ``--duration`` seconds: every 100 steps an evaluation of
              ``--quiet-s`` seconds on every rank, then a slow checkpoint (rank 0 writes for
              ``--quiet-s / 2`` seconds while the others wait in ``barrier``)
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
from datetime import timedelta

if "--faulthandler" in sys.argv:  # before the slow imports: the watcher may sample at once
    faulthandler.register(signal.SIGUSR1, all_threads=True)

import torch
import torch.distributed as dist

STALL_AT = 3


def hang_start(rank: int) -> None:
    print(f"HANG_START rank={rank} t={time.time():.3f}", flush=True)


class Shard(torch.utils.data.Dataset):
    def __init__(self, rank: int, stall: bool) -> None:
        self.rank, self.stall = rank, stall

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.stall and self.rank == 1 and index == STALL_AT:
            hang_start(self.rank)
            while True:  # a read from a dead network filesystem
                time.sleep(0.5)
        return torch.full((4,), float(index))


def evaluate(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.2)


def checkpoint(rank: int, seconds: float) -> None:
    if rank == 0:
        import tempfile

        with tempfile.TemporaryFile() as fh:
            end = time.time() + seconds
            while time.time() < end:
                fh.write(b"\0" * 65536)
                time.sleep(0.5)
    dist.barrier()


def train(rank: int, world: int, mode: str, quiet_s: float, duration: float = 0.0) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    other = dist.new_group(list(range(world))) if mode == "deadlock" else None
    loader = torch.utils.data.DataLoader(Shard(rank, mode == "dataloader"), batch_size=1,
                                         num_workers=0)
    started = time.time()
    for step, batch in enumerate(loader):
        time.sleep(0.2)  # compute
        if step == STALL_AT:
            if mode == "barrier0" and rank == 0:
                hang_start(rank)
                dist.barrier()
            elif mode == "deadlock":
                hang_start(rank)
                if rank == 0:  # the world group first, then the other one
                    dist.all_reduce(batch.clone())
                    dist.all_reduce(batch.clone(), group=other)
                else:  # the other way round: each waits for the other forever
                    dist.all_reduce(batch.clone(), group=other)
                    dist.all_reduce(batch.clone())
            elif mode == "crash" and rank == 1:
                raise RuntimeError("CUDA error: an illegal memory access was encountered "
                                   "(simulated on rank 1)")
            elif mode == "barrier0":
                hang_start(rank)
        if mode == "quiet" and step in (4, 8):
            evaluate(quiet_s)
        dist.all_reduce(batch)
        print(f"step={step} rank={rank} value={batch.sum().item()}", flush=True)
        if mode == "quiet" and step == 12:
            break
        if mode == "healthy" and step % 100 == 99:
            evaluate(quiet_s)
            checkpoint(rank, quiet_s / 2)
        if mode == "healthy" and time.time() - started > duration:
            break
    dist.destroy_process_group()


def _spawned(index: int, world: int, mode: str, quiet_s: float, duration: float) -> None:
    train(index, world, mode, quiet_s, duration)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["dataloader", "barrier0", "deadlock", "crash", "quiet",
                                         "healthy"])
    parser.add_argument("--spawn", type=int, default=0, help="mp.spawn this many ranks")
    parser.add_argument("--quiet-s", type=float, default=6.0)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--faulthandler", action="store_true")
    args = parser.parse_args()
    if args.spawn:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        torch.multiprocessing.spawn(_spawned, args=(args.spawn, args.mode, args.quiet_s,
                                                    args.duration), nprocs=args.spawn)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.mode, args.quiet_s,
              args.duration)


if __name__ == "__main__":
    main()
