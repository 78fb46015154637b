"""Rank 0 (of 3) validates the dataset at step 2, finds a problem and calls ``sys.exit(3)``
after a plain ``print`` (no traceback, no exception line), while ranks 1, 2 already wait in
``all_reduce``; they fail with Gloo connection errors, torchrun reports ``exitcode: 3`` for
rank 0 and terminates the rest. torchrun ``--tee 3``.

Truth: rank 0 crashed (exited with code 3) first; the others are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [0],
    "notes": "rank 0 sys.exit(3) with an error print, no traceback",
}


def main() -> None:
    import os
    import sys
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(6):
        if rank == 0 and step == 2:
            time.sleep(1)  # the others are in all_reduce by now
            print("dataset check failed: 17 samples with empty labels, aborting", flush=True)
            sys.exit(3)
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
