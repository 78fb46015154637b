"""HANG: uneven inputs. Rank 1's data shard has fewer batches: it leaves the training loop and
waits in the final ``dist.barrier()`` while ranks 0 and 2 run one more DDP step and block in
backward, where DDP all-reduces the gradients. Nothing fails until the (long) timeout.
Launched with torchrun; DDP over a tiny model.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": "uneven_inputs",
    "ranks": [1],
    "frame": "barrier",
    "notes": "ranks 0, 2 in DDP backward (gradient all-reduce); rank 1 past the loop, in barrier",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 3 if rank == 1 else 4  # drop_last=False over an uneven split
    for step in range(batches):
        if step == batches - 1 and rank != 1:
            print(f"SCENARIO_READY rank={rank} last step {step}", flush=True)
        loss = model(torch.randn(8, 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank={rank} step={step} loss={loss.item():.3f}", flush=True)
    print(f"SCENARIO_READY rank={rank} finished its {batches} batches", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
