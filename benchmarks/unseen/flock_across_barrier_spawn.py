"""HANG under ``torch.multiprocessing.spawn`` (3 ranks): a dataset cache guarded by a file lock
(a small ``FileLock`` like the ``filelock`` package's: ``fcntl.flock`` with ``LOCK_NB``, polled
every 0.5 s). Rank 0 takes the lock exclusively and builds the cache; the others take it shared
to read the cache once it is built. The bug: rank 0 calls ``dist.barrier()`` ("wait until
everyone has the cache") *before* it releases the lock, so ranks 1, 2 keep polling the lock in
``load_cache`` and never reach the barrier, and rank 0 waits in the barrier forever. (Rank 0
takes the lock before the config ``broadcast``, so the others always find it held.) Each rank
logs what it waits for.

Truth: ranks 1 and 2 are stuck outside the collective, in ``load_cache`` (waiting for the file
lock), which keeps rank 0's barrier from completing; the lock they wait for is held by rank 0
(the fix is there: release the lock before the barrier), but the ranks that never reach the
collective are 1 and 2.
"""

LAUNCH = {"launcher": "python", "ready": 3, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1, 2],
    "frame": "load_cache",
    "notes": "rank 0 in barrier holding the lock (LOCK_EX); ranks 1, 2 polling it in load_cache",
}

WORLD_SIZE = 3


class FileLock:
    """A process-wide lock on a file, held until released or the process exits."""

    def __init__(self, path: str) -> None:
        import os

        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def acquire(self, shared: bool = False, poll_interval: float = 0.5) -> None:
        import fcntl
        import time

        mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        while True:
            try:
                fcntl.flock(self.fd, mode)
                return
            except BlockingIOError:
                time.sleep(poll_interval)

    def release(self) -> None:
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)


def build_cache(rank: int, lock: FileLock) -> None:
    import torch
    import torch.distributed as dist

    torch.save({"vocab": list(range(1000))}, "cache.pt")
    print(f"rank {rank}: cache built, waiting for the other ranks", flush=True)
    print(f"SCENARIO_READY rank={rank} barrier (holding cache.lock)", flush=True)
    dist.barrier()  # BUG: the lock is still held
    lock.release()


def load_cache(rank: int, lock: FileLock) -> "object":
    import torch
    import torch.distributed as dist

    print(f"rank {rank}: waiting for cache.lock", flush=True)
    print(f"SCENARIO_READY rank={rank} load_cache", flush=True)
    lock.acquire(shared=True)
    cache = torch.load("cache.pt")
    lock.release()
    dist.barrier()
    return cache


def worker(rank: int) -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    lock = FileLock("cache.lock")
    if rank == 0:
        lock.acquire()
    config = torch.tensor([42.0])
    dist.broadcast(config, src=0)
    print(f"rank {rank}: config {config.item()}", flush=True)
    if rank == 0:
        build_cache(rank, lock)
    else:
        load_cache(rank, lock)
    for step in range(4):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
