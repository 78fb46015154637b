"""HANG: rank 2 blocks inside its DataLoader (``num_workers=0``): ``__getitem__`` waits on a
"network filesystem" read that never returns, while ranks 0 and 1 wait in
``dist.all_reduce`` for it. Gloo timeout 300 s. Plain ``torchrun`` (unprefixed output).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LAUNCH = {"launcher": "torchrun", "nproc": 3, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [2],
    "frame": "__getitem__",
    "notes": "ranks 0, 1 in all_reduce; rank 2 in DataLoader -> __getitem__ -> time.sleep",
}

STALL_AT = 4


class ShardDataset:
    """A map-style dataset (``__len__`` + ``__getitem__``), as ``DataLoader`` takes it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        import time

        import torch

        if self.rank == 2 and index == STALL_AT:
            print(f"SCENARIO_READY rank={self.rank} reading sample {index}", flush=True)
            while True:  # a read from a dead NFS mount
                time.sleep(0.5)
        return torch.full((4,), float(index))


def main() -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    loader = DataLoader(ShardDataset(rank), batch_size=1, num_workers=0)
    for step, batch in enumerate(loader):
        if rank != 2 and step == STALL_AT:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(batch)
        print(f"rank={rank} step={step} sum={batch.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
