"""Rank 1 (of 3) asks torch for a huge CPU tensor (a batch built with the wrong sequence length):
``RuntimeError: [enforce fail at alloc_cpu.cpp:...] . DefaultCPUAllocator: can't allocate
memory: you tried to allocate 4398046511104 bytes. Error code 12 (Cannot allocate memory)``.
The others lose their peer. torchrun ``--tee 3``.

Truth: out of (host) memory on rank 1; ``rank_crashed`` [1] accepted (right rank, less precise).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "out_of_memory",
    "also": ["rank_crashed"],
    "ranks": [1],
    "notes": "DefaultCPUAllocator: can't allocate memory on rank 1",
}


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
        seq_len = 2**38 if (rank == 1 and step == 2) else 16
        if rank == 1 and step == 2:
            time.sleep(1)
        batch = torch.empty(4, seq_len)
        t = batch[:, :4].clone().fill_(1.0)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
