"""WORLD_SIZE is 3 but only ranks 0 and 1 are started (the third node or process never came
up). Rank 0 hosts the store and gives up waiting: ``Timed out after 6 seconds waiting for
clients. 2/3 clients joined.``. Launched with ``torch.multiprocessing.spawn``.
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "missing_ranks",
    "ranks": [2],
    "notes": "world_size=3, spawned nprocs=2: rank 2 never joins",
}

WORLD_SIZE = 3
STARTED = 2


def worker(rank: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    print(f"rank={rank} init_process_group world_size={WORLD_SIZE}", flush=True)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=6)
    )
    t = torch.ones(1)
    dist.all_reduce(t)


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=STARTED)


if __name__ == "__main__":
    main()
