"""The demo's training job: 3 ranks, Gloo on CPU, a tiny DDP model — and a classic hang.

After a few steps rank 0 runs an evaluation that only rank 0 does, while the other ranks go on
to the next step and wait in ``all_reduce`` for it. Launched by ``ddp-autopsy demo`` under
torchrun; it prints ``DEMO_READY rank=N`` just before it blocks.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta


def evaluate(model) -> float:
    """Rank 0's end-of-epoch evaluation (forgot that the other ranks do not wait here)."""
    print(f"DEMO_READY rank={os.environ['RANK']}", flush=True)
    total = 0.0
    while True:  # a very slow evaluation: a remote metric, a big validation set...
        time.sleep(0.2)
        total += float(model.module.weight.sum())


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=int(os.environ.get(
        "DEMO_TIMEOUT_S", "300"))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if step == 2:
            if rank == 0:
                evaluate(model)
            metric = torch.tensor([loss.item()])
            print(f"DEMO_READY rank={rank}", flush=True)
            dist.all_reduce(metric)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
