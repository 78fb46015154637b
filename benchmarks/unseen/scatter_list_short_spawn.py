"""Under ``torch.multiprocessing.spawn`` (4 ranks): at the start of each epoch rank 0 assigns
data shards to the ranks with ``dist.scatter``. It builds the list of per-rank assignments from
the data config's ``num_workers = 3`` (the config was written for the 3-GPU box) while the job
runs on 4 ranks, so rank 0's ``scatter_list`` has 3 tensors for a group of 4: Gloo rejects it on
rank 0 (``ProcessGroupGloo::scatter: Incorrect input list size 3. Input list size should be 4,
same as size of the process group.``) before anything is sent. Ranks 1-3 wait in ``scatter``
and are torn down by spawn (``ProcessRaisedException: -- Process 0 terminated with the
following error``).

Truth: rank 0 crashed (the exception is raised on rank 0 only). ``collective_mismatch`` [0] is
accepted too: the error is about a collective's arguments on rank 0 disagreeing with the group
(the fix is in rank 0's call). The others' state is a symptom.
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "also": ["collective_mismatch"],
    "ranks": [0],
    "notes": "scatter_list of 3 on rank 0 in a group of 4; ranks 1-3 wait in scatter",
}

WORLD_SIZE = 4
DATA_CONFIG = {"num_workers": 3, "num_shards": 12}


def assign_shards(rank: int, epoch: int) -> "object":
    import torch
    import torch.distributed as dist

    mine = torch.zeros(4, dtype=torch.long)
    if rank == 0:
        n = DATA_CONFIG["num_workers"]
        per = DATA_CONFIG["num_shards"] // n
        plan = [torch.arange(w * per, w * per + 4) + epoch for w in range(n)]
        print(f"rank 0: epoch {epoch}: shard plan for {len(plan)} workers", flush=True)
        dist.scatter(mine, plan, src=0)
    else:
        print(f"rank {rank}: epoch {epoch}: waiting for my shards", flush=True)
        dist.scatter(mine, None, src=0)
    return mine


def worker(rank: int) -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    seed = torch.tensor([1234])
    dist.broadcast(seed, src=0)
    print(f"rank {rank}: seed {seed.item()}", flush=True)
    for epoch in range(2):
        shards = assign_shards(rank, epoch)
        for step in range(3):
            t = shards.float().sum().reshape(1)
            dist.all_reduce(t)
            print(f"rank {rank} epoch {epoch} step {step} sum {t.item()}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
