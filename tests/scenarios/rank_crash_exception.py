"""Rank 2 raises ``ValueError("bad batch 17")`` at step 3 while ranks 0 and 1 sit in
``all_reduce``. The survivors' Gloo calls fail with ``Connection closed by peer`` (symptoms),
torchrun stops the group and prints its ``ChildFailedError`` summary. ``main`` is wrapped in
torchelastic's ``@record``, so the summary carries each failed rank's traceback.
Launched with ``torchrun --tee 3``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "exception": "ValueError: bad batch 17",
    "notes": "ranks 0 and 1 fail afterwards with Gloo connection errors: symptoms only",
}


def load_batch(rank: int, step: int) -> list[float]:
    if rank == 2 and step == 3:
        raise ValueError("bad batch 17")
    return [float(rank + step)] * 4


def main() -> None:
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def train() -> None:
        dist.init_process_group("gloo", timeout=timedelta(seconds=10))
        rank = dist.get_rank()
        for step in range(6):
            if rank == 2 and step == 3:
                time.sleep(1)  # let the others block in all_reduce first
            t = torch.tensor(load_batch(rank, step))
            dist.all_reduce(t)
            print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
        dist.destroy_process_group()

    train()


if __name__ == "__main__":
    main()
