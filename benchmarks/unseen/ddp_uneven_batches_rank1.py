"""Uneven inputs under DDP without ``Join``: every rank (of 3) trains a DDP model on its own
shard (``samples[rank::3]``, batches of 4, no ``DistributedSampler``, no ``Join``); rank 1's
shard file ends early (24 samples instead of 28), so rank 1 gets 6 batches and ranks 0, 2 get
7. After its 6th batch rank 1 leaves the loop and all-reduces its epoch
stats (``[loss_sum, n_batches]``), while ranks 0 and 2 are in their 7th backward,
where DDP all-reduces the gradient bucket. The collectives pair up across ranks with
different sizes: Gloo aborts rank 1 (``terminate called after throwing an instance of
'gloo::EnforceNotMet'`` ... ``108 vs 4. Received data size doesn't match expected size. Is there a
distributed collective mismatch in your code?``, SIGABRT); torchrun stops the others. Plain
torchrun with ``--log-dir`` (no ``--tee``): the ranks' lines are not prefixed.

Truth: uneven inputs; the culprit is rank 1, the rank that ran out of batches first and left
the training loop while the others were still in DDP's backward. ``collective_mismatch`` [1] is
accepted too: that is how the uneven inputs surface (Gloo names it).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "timeout_s": 60}
EXPECT = {
    "cause": "uneven_inputs",
    "also": ["collective_mismatch"],
    "ranks": [1],
    "frame": "epoch_stats",
    "notes": "rank 1: 6 batches, ranks 0, 2: 7; rank 1 all_reduce(2 floats) vs DDP bucket",
}

N_SAMPLES = 84  # 28 per rank: 7 batches of 4


def shard_batches(rank: int, world: int) -> list:
    import torch

    g = torch.Generator().manual_seed(1234)
    data = torch.randn(N_SAMPLES, 8, generator=g)
    mine = data[rank::world]
    if rank == 1:
        mine = mine[:24]  # its shard file ends early (28 -> 24 samples: 6 batches)
    return [mine[i:i + 4] for i in range(0, len(mine) - 3, 4)]


def epoch_stats(rank: int, loss_sum: float, n: int) -> "object":
    import torch
    import torch.distributed as dist

    print(f"rank {rank}: epoch done after {n} batches, reducing stats", flush=True)
    stats = torch.tensor([loss_sum, float(n)])
    dist.all_reduce(stats)
    return stats


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = shard_batches(rank, world)
    print(f"rank {rank}: {len(batches)} batches this epoch", flush=True)
    loss_sum = 0.0
    for i, x in enumerate(batches):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_sum += loss.item()
        print(f"rank {rank} batch {i} loss {loss.item():.4f}", flush=True)
    stats = epoch_stats(rank, loss_sum, len(batches))
    print(f"rank {rank}: mean loss {stats[0].item() / stats[1].item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
