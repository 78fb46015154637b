"""At the end of epoch 0 every rank (of 3) gathers its evaluation stats with
``dist.all_gather_object``. Rank 1 skipped a few corrupt samples and counts the reasons in a
``collections.defaultdict(lambda: 0)`` that it puts into its stats dict; the lambda cannot be
pickled, so ``all_gather_object`` raises on rank 1 before it sends anything
(``AttributeError: Can't pickle local object ...<lambda>``, or a ``PicklingError`` on other
Python versions). Ranks 0, 2 wait in the ``all_gather_object``'s first all_gather (of the
object sizes) and lose their peer. Plain torchrun.

Truth: rank 1 crashed (an exception while pickling its object); the others are symptoms.
Not ``collective_mismatch``: every rank called the same collective with valid arguments of
its kind; rank 1 failed locally before the exchange.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "exception": "AttributeError: Can't pickle local object",
    "notes": "defaultdict(lambda) in rank 1's stats; all_gather_object pickles it and fails",
}


def evaluate(rank: int) -> dict:
    import collections

    stats: dict = {"rank": rank, "samples": 512, "acc": 0.71 + 0.01 * rank}
    if rank == 1:  # only rank 1's shard had corrupt samples this epoch
        skipped = collections.defaultdict(lambda: 0)
        skipped["bad_jpeg"] += 3
        skipped["empty_caption"] += 1
        stats["skipped"] = skipped
        print(f"rank {rank}: skipped {sum(skipped.values())} corrupt samples", flush=True)
    return stats


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(3):
        t = torch.ones(4) * step
        dist.all_reduce(t)
        print(f"rank {rank} epoch 0 step {step} sum {t.sum().item()}", flush=True)
    stats = evaluate(rank)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, stats)
    if rank == 0:
        acc = sum(s["acc"] for s in gathered) / world
        print(f"epoch 0 eval acc {acc:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
