"""HANG at start-up: the last rank (3 of 4) downloads its dataset shard *before*
``init_process_group`` (``download_shard`` stalls: a slow mirror), so ranks 0-2 wait in
``init_process_group`` for the fourth rank to join the store. torchrun ``--log-dir``.

Truth: rank 3 is alive and busy outside any collective: ``rank_stuck_outside_collective`` [3].
``missing_ranks`` [3] is accepted (from the others' side it never joined).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "log_dir": True, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "also": ["missing_ranks"],
    "ranks": [3],
    "frame": "download_shard",
    "notes": "rank 3 in download_shard before init; ranks 0-2 in init_process_group",
}


def download_shard(rank: int) -> None:
    import time

    print(f"rank {rank}: downloading shard-{rank:05d}.tar from the mirror", flush=True)
    if rank == 3:
        print(f"SCENARIO_READY rank={rank} download", flush=True)
        while True:
            time.sleep(0.5)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    download_shard(rank)
    if rank != 3:
        print(f"SCENARIO_READY rank={rank} init_process_group", flush=True)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
