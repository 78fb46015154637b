"""HANG: rank 1 calls ``dist.barrier()`` (a "wait for the checkpoint" that only it reaches) while
ranks 0 and 2 all-reduce their loss. No rank is outside a collective: the stacks alone show the
mismatch. Gloo timeout 300 s; collected while hung. Plain ``torchrun``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1],
    "frame": "wait_for_checkpoint",
    "notes": "rank 1 in barrier (from wait_for_checkpoint); ranks 0, 2 in all_reduce (from main)",
}


def wait_for_checkpoint() -> None:
    import torch.distributed as dist

    dist.barrier()


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    for step in range(4):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step}", flush=True)
    print(f"SCENARIO_READY rank={rank}", flush=True)
    if rank == 1:
        wait_for_checkpoint()
    else:
        loss = torch.ones(1)
        dist.all_reduce(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
