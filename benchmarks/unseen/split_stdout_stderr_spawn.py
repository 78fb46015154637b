"""The job sends stdout and stderr to different files (``python train.py > out.txt 2> err.txt``:
here the parent redirects its own fds 1 and 2 before ``torch.multiprocessing.spawn``, so the
captured console is empty): progress lines ``rank r step s`` in ``out.txt``, every traceback in
``err.txt``. Rank 1 (of 3) hits ``KeyError: 'labels'`` at step 2; spawn reports
``ProcessRaisedException: -- Process 1 terminated with the following error``.

Truth: rank 1 crashed first (KeyError).
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "stdout and stderr in out.txt / err.txt; console empty",
}

WORLD_SIZE = 3


def worker(rank: int) -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    for step in range(5):
        batch = {"input": torch.ones(4), "labels": torch.zeros(4)}
        if rank == 1 and step == 2:
            time.sleep(1)
            del batch["labels"]
        t = batch["input"] + batch["labels"]
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import os

    import torch.multiprocessing as mp

    out = os.open("out.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    err = os.open("err.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(err, 2)
    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
