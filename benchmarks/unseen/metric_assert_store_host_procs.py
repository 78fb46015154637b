"""One process per rank (srun-like, ``rank<N>.log`` each), 3 ranks; rank 0 hosts the TCPStore.
After 3 training steps every rank predicts its part of a 10-sample validation set, split with
``DistributedSampler`` (``shuffle=False``, ``drop_last=False``: it pads to 12 by repeating two
samples), and the predictions are gathered with ``dist.all_gather_object``. Rank 0 alone
computes the accuracy, whose helper asserts that predictions and labels line up:
``AssertionError: 12 predictions for 10 labels``. Rank 0 exits with that traceback while ranks
1 and 2 wait in the end-of-eval ``dist.barrier()``; they lose their peer (and the store that
lived in rank 0's process) and fail too.

Truth: rank 0 crashed first (AssertionError in ``accuracy``). The padded samples come from the
sampler on every rank, not from one faulty rank, and the assertion ran only on rank 0.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [0],
    "exception": "AssertionError: 12 predictions for 10 labels",
    "notes": "rank 0 (store host) asserts after all_gather_object; 1, 2 in barrier",
}

VAL_SIZE = 10


def accuracy(preds: list[int], labels: list[int]) -> float:
    assert len(preds) == len(labels), f"{len(preds)} predictions for {len(labels)} labels"
    return sum(int(p == y) for p, y in zip(preds, labels, strict=True)) / len(labels)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    rank = int(os.environ["RANK"])
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    world = dist.get_world_size()
    print(f"rank {rank}/{world}: process group ready", flush=True)
    for step in range(3):
        t = torch.ones(4) * step
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    labels = [i % 3 for i in range(VAL_SIZE)]
    sampler = DistributedSampler(range(VAL_SIZE), num_replicas=world, rank=rank, shuffle=False)
    preds = [(i * 7) % 3 for i in sampler]
    print(f"rank {rank}: {len(preds)} validation predictions", flush=True)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, preds)
    if rank == 0:
        all_preds = [p for part in gathered for p in part]  # type: ignore[union-attr]
        print(f"rank 0: val accuracy {accuracy(all_preds, labels):.3f}", flush=True)
    dist.barrier()
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
