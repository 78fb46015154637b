"""Rank 2 (of 3) raises a real ``MemoryError``: it builds an index buffer far larger than the
host can give (``bytearray(2**50)``), so Python reports host memory exhaustion with a
traceback ending in a bare ``MemoryError`` line, no message. The others lose their peer.
torchrun ``--tee 3``.

Truth: out of (host) memory on rank 2. ``rank_crashed`` [2] is accepted too: the rank did
crash first, only less precisely named.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "out_of_memory",
    "also": ["rank_crashed"],
    "ranks": [2],
    "notes": "bare MemoryError on rank 2",
}


def build_index(rank: int) -> bytearray:
    size = 2**50 if rank == 2 else 1024
    return bytearray(size)


def main() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(6):
        if step == 2:
            if rank == 2:
                time.sleep(1)
            print(f"rank {rank}: building index", flush=True)
            build_index(rank)
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
