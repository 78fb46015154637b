"""HANG: rank 0 waits forever in ``queue.Queue.get()`` for a batch from its prefetch thread,
which died on an exception (printed by ``threading.excepthook``: a traceback, but the process
lives on). Ranks 1, 2 wait in ``all_reduce``. torchrun ``--tee 3``.

Truth: rank 0 is stuck outside the collective (in ``next_batch`` -> ``queue.get``); its thread's
traceback is how it got there, not a crash: the process never exited on its own.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [0],
    "frame": "next_batch",
    "notes": "rank 0 in queue.get (prefetch thread died); ranks 1, 2 in all_reduce",
}


def prefetch(rank: int, q: "object") -> None:
    import torch

    for step in range(100):
        if rank == 0 and step == 3:
            raise OSError(f"shard-0003.tar: unexpected end of archive (rank {rank})")
        q.put(torch.full((4,), float(step)))


def next_batch(rank: int, q: "object", step: int) -> "object":
    if rank == 0 and step == 3:
        print(f"SCENARIO_READY rank={rank} waiting for batch {step}", flush=True)
    return q.get()  # no timeout: the producer is dead


def main() -> None:
    import os
    import queue
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    q: queue.Queue = queue.Queue(maxsize=2)
    threading.Thread(target=prefetch, args=(rank, q), name="prefetch", daemon=True).start()
    for step in range(10):
        batch = next_batch(rank, q, step)
        if rank != 0 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(batch)
        print(f"rank={rank} step={step} sum={batch.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
