"""HANG under ``torch.multiprocessing.spawn``: after step 2, rank 0 calls
``save_checkpoint()``, which stalls (a full disk / slow object store), while ranks 1 and 2
wait in ``dist.barrier()`` for the checkpoint to be written. Gloo timeout 300 s.
"""

LAUNCH = {"launcher": "python", "ready": 3, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [0],
    "frame": "save_checkpoint",
    "notes": "ranks 1, 2 in barrier; rank 0 in save_checkpoint -> time.sleep",
}

WORLD_SIZE = 3


def save_checkpoint(rank: int, state: dict) -> None:
    import time

    print(f"SCENARIO_READY rank={rank} saving checkpoint", flush=True)
    while True:  # the write never completes
        time.sleep(0.5)


def worker(rank: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=300)
    )
    model = torch.nn.Linear(4, 4)
    for step in range(10):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
        if step == 2:
            if rank == 0:
                save_checkpoint(rank, model.state_dict())
            else:
                print(f"SCENARIO_READY rank={rank} barrier after step={step}", flush=True)
            dist.barrier()  # everyone waits until the checkpoint is written
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
