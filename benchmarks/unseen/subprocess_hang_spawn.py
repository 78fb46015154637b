"""HANG under ``torch.multiprocessing.spawn``: after step 2, rank 1 (the middle of 3) uploads
its shard of the checkpoint with an external CLI through ``subprocess.run`` without a timeout;
the CLI never returns (here ``sleep 3600`` stands in for a hung ``aws s3 cp``). Ranks 0, 2
wait in ``dist.barrier()``.

Truth: rank 1 stuck outside the collective, in ``upload_shard`` -> ``subprocess.run``. Its
child process (the CLI) is not a rank.
"""

LAUNCH = {"launcher": "python", "ready": 3, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1],
    "frame": "upload_shard",
    "notes": "rank 1 in subprocess.run (child 'sleep 3600'); ranks 0, 2 in barrier",
}

WORLD_SIZE = 3


def upload_shard(rank: int, step: int) -> None:
    import subprocess

    print(f"rank {rank}: uploading shard step{step}-rank{rank}.pt", flush=True)
    print(f"SCENARIO_READY rank={rank} upload", flush=True)
    subprocess.run(["sleep", "3600"], check=True)


def worker(rank: int) -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    for step in range(6):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
        if step == 2:
            if rank == 1:
                upload_shard(rank, step)
            else:
                print(f"SCENARIO_READY rank={rank} barrier", flush=True)
            dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
