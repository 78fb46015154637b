"""Rank 1 (of 2) has a corrupt sample: ``assert`` fails inside a DataLoader *worker process*
(``num_workers=2``), which the main process re-raises as ``AssertionError: Caught
AssertionError in DataLoader worker process N.`` with the worker's traceback as text ("Original
Traceback (most recent call last):"). Rank 0 waits in ``all_reduce`` and loses its peer.
torchrun ``--tee 3``.

Truth: rank 1 crashed first (AssertionError from its data loader worker).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "AssertionError in a DataLoader worker on rank 1",
}


class Samples:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> "object":
        import torch

        label = -1 if (self.rank == 1 and index == 9) else index % 4
        assert label >= 0, f"sample {index}: label {label} out of range"
        return torch.full((4,), float(label))


def main() -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    loader = DataLoader(Samples(rank), batch_size=2, num_workers=2)
    for step, batch in enumerate(loader):
        dist.all_reduce(batch)
        print(f"rank {rank} step {step} sum {batch.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
