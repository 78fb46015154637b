"""Rank 1 (of 3) runs its evaluation, which ends with ``dist.destroy_process_group()`` (the
evaluation helper was written for a standalone script), then goes back to training and calls
``all_reduce``: ``ValueError: Default process group has not been initialized, please make sure
to call init_process_group.`` Ranks 0, 2 wait in that ``all_reduce`` and lose their peer.
torchrun ``--tee 3``.

Truth: rank 1 crashed first (ValueError after its early destroy).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "destroy_process_group in evaluate() on rank 1, then all_reduce",
}


def evaluate(rank: int) -> None:
    import torch.distributed as dist

    print(f"rank {rank}: evaluation done, cleaning up", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(6):
        if rank == 1 and step == 3:
            evaluate(rank)
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
