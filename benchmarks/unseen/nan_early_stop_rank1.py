"""HANG: a manual data-parallel loop (no DDP: gradients averaged with one ``all_reduce`` per
parameter in ``average_gradients``). Each rank checks its *local* loss before the backward:
``if not torch.isfinite(loss): break`` (an early-stopping guard). At step 4 rank 1 (of 3) gets a
batch with a NaN feature, prints ``non-finite loss at step 4, stopping early`` and leaves the
loop for the final ``dist.barrier()`` (before saving), while ranks 0, 2, whose losses are fine,
wait in the gradient ``all_reduce`` of step 4. The guard's decision is never shared. torchrun
``--log-dir``.

Truth: collective mismatch, rank 1 the odd one (a local decision to stop: barrier vs the
others' all_reduce). ``uneven_inputs`` [1] is accepted as well: the shape of the failure is
the same as a rank running out of data (one rank left the loop early, the others are still in
a training step), and the fix is the same (agree on stopping, e.g. all_reduce the flag).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["uneven_inputs"],
    "ranks": [1],
    "frame": "barrier",
    "notes": "rank 1 breaks out at step 4 (NaN loss) into barrier; ranks 0, 2 in all_reduce",
}


def get_batch(rank: int, step: int) -> "object":
    import torch

    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(16, 8, generator=g)
    if rank == 1 and step == 4:
        x[3, 5] = float("nan")  # a corrupt record in rank 1's shard
    return x


def average_gradients(model: "object", world: int, rank: int, step: int) -> None:
    import torch.distributed as dist

    if step == 4:
        print(f"SCENARIO_READY rank={rank} average_gradients step={step}", flush=True)
    for p in model.parameters():  # type: ignore[attr-defined]
        dist.all_reduce(p.grad)
        p.grad /= world


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        loss = model(get_batch(rank, step)).pow(2).mean()
        if not torch.isfinite(loss):
            print(f"rank {rank}: non-finite loss at step {step}, stopping early", flush=True)
            break
        loss.backward()
        average_gradients(model, world, rank, step)
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    print(f"SCENARIO_READY rank={rank} final barrier", flush=True)
    dist.barrier()
    if rank == 0:
        torch.save(model.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
