"""Under ``torch.multiprocessing.spawn`` (4 ranks), a forward hook registered on a layer of a
DDP model (an activation-statistics probe) raises ``FloatingPointError`` on rank 3, the last
rank, at step 2, inside DDP's forward. The others wait in the backward all-reduce and are
torn down by spawn (``ProcessRaisedException`` names process 3).

Truth: rank 3 crashed first (FloatingPointError in the hook).
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [3],
    "notes": "FloatingPointError raised in a forward hook on rank 3",
}

WORLD_SIZE = 4


def worker(rank: int) -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    state = {"step": 0}

    def activation_probe(module: torch.nn.Module, inp: tuple, out: torch.Tensor) -> None:
        if rank == 3 and state["step"] == 2:
            time.sleep(1)
            raise FloatingPointError(f"activation overflow in {module.__class__.__name__}")

    net[0].register_forward_hook(activation_probe)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        state["step"] = step
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
