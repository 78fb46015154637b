"""Under ``torch.multiprocessing.spawn`` (3 ranks): after each step every rank calls
``maybe_requeue()``, a helper that looks for a preemption flag file for its node and, if it
finds one, calls ``os._exit(3)`` ("exit code 3 = requeue me", for the scheduler). A flag left
over from an earlier preemption exists for rank 2's node only (the parent writes it at start,
standing in for the stale file), so at step 3 rank 2 vanishes: no message, no traceback, no
exception. The others are computing (0.5 s) when it happens; spawn reports
``ProcessExitedException: process 2 terminated with exit code 3`` and SIGTERMs them.

Truth: rank 2 crashed (exited with code 3 on its own). Not ``job_terminated``: nothing outside
the job stopped it; the exit came from the rank's own code.
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "notes": "rank 2 os._exit(3) after step 3 (stale preempt flag), silent; spawn names process 2",
}

WORLD_SIZE = 3


def maybe_requeue(rank: int, step: int) -> None:
    import os

    node = f"node{rank}"  # one rank per node in the real job
    if step >= 3 and os.path.exists(f"preempt_flags/{node}"):
        os._exit(3)


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
    for step in range(8):
        t = torch.ones(4) * step
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
        maybe_requeue(rank, step)
        time.sleep(0.5)  # forward/backward
    dist.destroy_process_group()


def main() -> None:
    import os

    import torch.multiprocessing as mp

    os.makedirs("preempt_flags", exist_ok=True)
    with open("preempt_flags/node2", "w") as fh:
        fh.write("preempted 2026-11-24T22:10:03Z\n")
    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
