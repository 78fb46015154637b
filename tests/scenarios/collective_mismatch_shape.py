"""At step 2 rank 2 all-reduces a tensor of a different shape (its last batch was smaller).

Same op on every rank, different sizes: with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` the
cross-rank check reports ``Detected mismatch between collectives on ranks`` with the
differing ``TensorShape``. Plain ``torchrun``: worker output unprefixed on the console.
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 3,
    "env": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    "timeout_s": 60,
}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [2],
    "op": "ALLREDUCE",
    "notes": "all_reduce of shape [8] on ranks 0, 1 vs [5] on rank 2 at step 2",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    for step in range(5):
        batch = 5 if (step == 2 and rank == 2) else 8
        grads = torch.ones(batch)
        dist.all_reduce(grads)
        print(f"rank={rank} step={step} sum={grads.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
