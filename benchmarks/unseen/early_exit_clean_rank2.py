"""Rank 2 (of 3) has a shorter data shard (10 batches, the others 16): it leaves the loop,
prints "training done", destroys its process group and exits with code 0, while ranks 0, 1
wait in their 11th ``all_reduce`` and lose their peer (``Connection closed by peer``), exit 1.
No DDP, no ``Join``. torchrun ``--tee 3``.

Truth: uneven inputs, rank 2 (the rank that ran out of data and left, cleanly).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "uneven_inputs",
    "ranks": [2],
    "notes": "rank 2 exits 0 after 10 batches; ranks 0, 1 fail in the 11th all_reduce",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    n_batches = 10 if rank == 2 else 16
    for step in range(n_batches):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    print(f"rank {rank}: training done after {n_batches} batches", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
