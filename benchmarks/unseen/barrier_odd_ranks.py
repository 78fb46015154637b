"""HANG: a ``dist.barrier()`` inside ``if rank % 2:`` (the odd ranks write a cache and wait for
each other). With 4 ranks, ranks 1 and 3 block in ``barrier`` and ranks 0 and 2 in the next
``all_reduce``; Gloo times out on all of them. torchrun ``--tee 3``.

Truth: collective mismatch; the odd ones are ranks 1 and 3 (they called a barrier nobody else
calls). Two against two: only the code says which side is wrong.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1, 3],
    "notes": "ranks 1, 3 in barrier (write_cache), ranks 0, 2 in all_reduce",
}


def write_cache(rank: int) -> None:
    import torch.distributed as dist

    print(f"rank {rank}: writing feature cache", flush=True)
    print(f"SCENARIO_READY rank={rank} barrier", flush=True)
    dist.barrier()


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(6):
        if step == 2:
            if rank % 2:
                write_cache(rank)
            else:
                print(f"SCENARIO_READY rank={rank} all_reduce", flush=True)
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
