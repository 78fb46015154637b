"""Rank 0 (of 2) calls ``init_process_group`` a second time (a ``setup_distributed()`` helper
called both by the script and by the trainer, guarded by ``is_available()`` instead of
``is_initialized()``); it raises ``ValueError: trying to initialize the default process group
twice!`` while rank 1 already waits in ``all_reduce`` and then loses its peer. torchrun
``--tee 3``.

Truth: rank 0 crashed first (ValueError).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [0],
    "notes": "ValueError: trying to initialize the default process group twice!",
}


def setup_distributed(timeout: float) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available():  # should be: not dist.is_initialized()
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))


class Trainer:
    def __init__(self, rank: int, timeout: float) -> None:
        import time

        if rank == 0:  # only rank 0 builds the trainer with the "distributed" flag on
            time.sleep(1)
            setup_distributed(timeout)


def main() -> None:
    import os

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    setup_distributed(timeout)
    rank = dist.get_rank()
    Trainer(rank, timeout)
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
