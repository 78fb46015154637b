"""Rank 1 (of 2) builds its gradient buffer in float64 (a ``torch.set_default_dtype`` left in
its branch of the code), rank 0 in float32; their ``all_reduce`` meets in Gloo, which aborts the
receiving process: ``terminate called after throwing an instance of 'gloo::EnforceNotMet'
... 8 vs 4. Received data size doesn't match expected size. Is there a distributed collective
mismatch in your code?`` (SIGABRT), and the other side loses its peer. torchrun ``--tee 3``.

Truth: collective mismatch (dtype); the odd rank is 1 (the one with float64), whichever
process Gloo aborts.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1],
    "notes": "float64 on rank 1 vs float32 on rank 0; Gloo aborts on a size check",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    if rank == 1:
        torch.set_default_dtype(torch.float64)  # "for numerical stability" on the eval rank
    for step in range(5):
        grad = torch.ones(4) * (step + 1)
        print(f"rank {rank} step {step} grad dtype {grad.dtype}", flush=True)
        dist.all_reduce(grad)
        print(f"rank {rank} step {step} sum {grad.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
