"""A "two-node" job on one host: torchrun --nnodes 2 --nproc-per-node 2, one agent per node.
Global rank 3 (node 1, local rank 1) gets stuck in ``save_checkpoint``; ranks 0-2 wait in
all_reduce. Prints ``READY rank=N`` before blocking."""

import os
import time
from datetime import timedelta


def save_checkpoint() -> None:
    print(f"READY rank={os.environ['RANK']}", flush=True)
    while True:
        time.sleep(0.5)


def main() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    for step in range(5):
        if step == 2 and rank == 3:
            save_checkpoint()
        if step == 2:
            print(f"READY rank={rank}", flush=True)
        t = torch.ones(2)
        dist.all_reduce(t)


if __name__ == "__main__":
    main()
