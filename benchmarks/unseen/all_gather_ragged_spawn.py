"""Under ``torch.multiprocessing.spawn`` (4 ranks): after 3 training steps every rank predicts
its slice of a 15-sample validation set (``indices[rank::4]``, no padding: ranks 0-2 get 4
samples, rank 3 gets 3) and the predictions are gathered with ``dist.all_gather`` into
``[torch.empty_like(preds) for _ in range(world)]``, a pattern that silently assumes equal
lengths. Rank 3's tensor is one element shorter, so the sizes disagree inside Gloo, which
aborts a process (``terminate called after throwing an instance of 'gloo::EnforceNotMet' ...
Received data size doesn't match expected size. Is there a distributed collective mismatch in
your code?``, SIGABRT); the others lose their peer or are stopped by spawn.

Truth: collective mismatch, rank 3 the odd one (its all_gather input has 3 elements, the
others' 4), whichever process Gloo aborts. ``uneven_inputs`` [3] is accepted: the uneven,
unpadded split of the validation set is where the odd size comes from.
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["uneven_inputs"],
    "ranks": [3],
    "notes": "all_gather of 4 vs 3 predictions (rank 3 short); Gloo aborts a process",
}

WORLD_SIZE = 4


def evaluate(model: "object", rank: int, world: int) -> "object":
    import torch
    import torch.distributed as dist

    torch.manual_seed(1234)
    val_x = torch.randn(15, 8)
    idx = list(range(15))[rank::world]
    with torch.no_grad():
        preds = model(val_x[idx]).argmax(-1).float()  # type: ignore[operator]
    print(f"rank {rank}: evaluated {len(idx)} samples", flush=True)
    gathered = [torch.empty_like(preds) for _ in range(world)]
    dist.all_gather(gathered, preds)
    return torch.cat(gathered)


def worker(rank: int) -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 5)
    for step in range(3):
        for p in model.parameters():
            g = torch.full_like(p, 0.01 * (rank + 1))
            dist.all_reduce(g)
            p.data.add_(g, alpha=-0.1)
        print(f"rank {rank} step {step} done", flush=True)
    preds = evaluate(model, rank, WORLD_SIZE)
    if rank == 0:
        print(f"val predictions: {preds.tolist()}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
