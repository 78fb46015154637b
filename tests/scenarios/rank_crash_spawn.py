"""The exception crash under ``torch.multiprocessing.spawn``: at step 2 rank 1 raises
``RuntimeError("loss is NaN at step 2")`` while ranks 0 and 2 are still computing.
``mp.spawn`` SIGTERMs the others and re-raises in the parent:
``torch.multiprocessing.spawn.ProcessRaisedException: -- Process 1 terminated with the
following error:`` followed by the child's traceback.

mp.spawn shows only the *first* process that exited with an error. Here the others are busy
so that is the culprit; had they been blocked in a collective, a survivor failing with
"Connection closed by peer" can exit first and be the one reported (a race, not reproduced).
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "exception": "RuntimeError: loss is NaN at step 2",
    "notes": "spawn process index == rank here; the other ranks are SIGTERMed, no traceback",
}

WORLD_SIZE = 3


def forward(rank: int, step: int) -> float:
    import time

    if step == 2:
        time.sleep(0.5 if rank == 1 else 3.0)  # ranks 0 and 2 got a heavier batch
    return float("nan") if (rank == 1 and step == 2) else 1.0 / (step + 1)


def check_loss(loss: float, step: int) -> None:
    if loss != loss:  # NaN
        raise RuntimeError(f"loss is NaN at step {step}")


def worker(rank: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=10))
    for step in range(5):
        loss = forward(rank, step)
        check_loss(loss, step)
        t = torch.tensor([loss])
        dist.all_reduce(t)
        print(f"rank={rank} step={step} loss={t.item() / WORLD_SIZE:.3f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
