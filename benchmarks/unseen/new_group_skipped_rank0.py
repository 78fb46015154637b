"""HANG in ``dist.new_group``, caused by an earlier ``new_group`` that rank 0 skipped. At start
every rank sets up its parallel groups in ``setup_groups()``; the "worker" group (ranks 1, 2:
the ranks that run the data pipeline; rank 0 is the coordinator) is created only where it is
needed: ``if rank in WORKERS: dist.new_group(WORKERS)``. ``new_group`` must be entered by every
rank of the job, even ranks not in the group; in torch 2.13 skipping it raises nothing (no
barrier): the worker group works, training runs for 3 steps. But each rank numbers its groups
with a counter, and rank 0's now lags one behind. At step 3 every rank builds an evaluation
group of all ranks (``dist.new_group([0, 1, 2], timeout=...)``): rank 0 names it group 1, ranks
1, 2 group 2, so they wait in the Gloo rendezvous for each other's keys under different names;
all three time out in ``new_group`` (``DistStoreError: wait timeout ... keys:
/default_pg/0//1//cpu//0/...`` on rank 0, ``.../2//cpu//...`` on 1, 2). torchrun ``--tee 3``.

Truth: a collective mismatch whose culprit is rank 0: it did not enter the first ``new_group``
that ranks 1, 2 entered (that is the call sequence that differs), although at the hang all three
ranks wait in the same ``new_group`` call.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [0],
    "frame": "setup_groups",
    "notes": "rank 0 skipped new_group([1, 2]); at step 3 all three wait in new_group([0,1,2]) "
             "under group names 1 (rank 0) vs 2 (ranks 1, 2)",
}

WORKERS = [1, 2]


def setup_groups(rank: int) -> "object":
    import torch.distributed as dist

    worker_group = None
    if rank in WORKERS:  # BUG: new_group must be called by every rank
        worker_group = dist.new_group(WORKERS)
        print(f"rank {rank}: joined worker group {WORKERS}", flush=True)
    return worker_group


def build_eval_group(rank: int, world: int, timeout: float) -> "object":
    from datetime import timedelta

    import torch.distributed as dist

    print(f"rank {rank}: building eval group of {world} ranks", flush=True)
    print(f"SCENARIO_READY rank={rank} new_group", flush=True)
    return dist.new_group(list(range(world)), timeout=timedelta(seconds=timeout))


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    worker_group = setup_groups(rank)
    for step in range(6):
        if step == 3:
            eval_group = build_eval_group(rank, world, timeout)
            t = torch.ones(1)
            dist.all_reduce(t, group=eval_group)
        grads = torch.full((8,), float(rank + step))
        dist.all_reduce(grads)
        if worker_group is not None:
            shards = torch.ones(2)
            dist.all_reduce(shards, group=worker_group)
        print(f"rank {rank} step {step} grad mean {grads.mean().item():.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
