"""HANG: after step 2, rank 0 (of 3) evaluates the *DDP-wrapped* model (``ddp_model(x)``, not
``ddp_model.module(x)``) while ranks 1, 2 go straight to ``dist.barrier()``. The model has a
BatchNorm, so DDP's forward broadcasts its buffers first (``broadcast_buffers=True``): rank 0
blocks in that broadcast inside DDP's forward, ranks 1, 2 in the barrier. torchrun
``--log-dir``.

Truth: collective mismatch, rank 0 the odd one (DDP's buffer broadcast vs barrier).
``rank_stuck_outside_collective`` [0] is accepted: from the user's side rank 0 is "in
evaluation", and naming rank 0 in ``evaluate`` points to the fix.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["rank_stuck_outside_collective"],
    "ranks": [0],
    "frame": "evaluate",
    "notes": "rank 0: evaluate -> DDP forward -> _sync_buffers broadcast; ranks 1, 2 in barrier",
}


def evaluate(model: "object", rank: int) -> None:
    import torch

    print(f"rank {rank}: evaluating", flush=True)
    print(f"SCENARIO_READY rank={rank} evaluate", flush=True)
    with torch.no_grad():
        out = model(torch.randn(8, 4))  # type: ignore[operator]
    print(f"eval loss {out.pow(2).mean().item():.4f}", flush=True)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                              torch.nn.Linear(4, 1))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if step == 2:
            if rank == 0:
                model.eval()
                evaluate(model, rank)
                model.train()
            else:
                print(f"SCENARIO_READY rank={rank} barrier", flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
