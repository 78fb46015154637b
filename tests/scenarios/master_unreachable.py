"""Ranks 1 and 2 start, but nothing listens at MASTER_ADDR:MASTER_PORT (rank 0's node never
came up, or the port is firewalled). Each worker's TCPStore client retries the connection
until ``init_process_group``'s timeout: ``The client socket has timed out after 3000ms while
trying to connect to (127.0.0.1, PORT)``. Launched with ``torch.multiprocessing.spawn``.
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "master_unreachable",
    "ranks": [],
    "reporting_ranks": [1, 2],
    "notes": "MASTER_ADDR=127.0.0.1, MASTER_PORT: a free port nobody listens on; the culprit "
    "is the endpoint (rank 0 never started), not a rank that ran",
}

WORLD_SIZE = 3


def worker(index: int) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    rank = index + 1  # rank 0 is the one that never started
    print(f"rank={rank} connecting to master", flush=True)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=3))


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE - 1)


if __name__ == "__main__":
    main()
