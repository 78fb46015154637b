"""HANG, with stacks in the logs: every rank arms ``faulthandler.dump_traceback_later(6)`` (a
common "dump my stacks if a step takes too long" guard), re-armed each step. Rank 1 (of 3) gets
stuck in ``tokenize_batch`` (a regex with catastrophic backtracking, here a plain loop) at step
3; after 6 s each rank's faulthandler prints ``Timeout (0:00:06)!`` and its threads' stacks
(``Thread 0x... (most recent call first):`` / ``  File "...", line N in func``) to stderr:
rank 1's shows ``tokenize_batch``, ranks 0 and 2 show ``all_reduce``. Then the Gloo timeout
ends the job. torchrun ``--tee 3``.

Truth: rank 1 stuck outside the collective (``tokenize_batch``), readable from the logs' stacks.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60, "logs_gloo_timeout": 15}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1],
    "frame": "tokenize_batch",
    "notes": "faulthandler stacks: rank 1 in tokenize_batch, ranks 0, 2 in all_reduce",
}


def tokenize_batch(rank: int, step: int) -> list[int]:
    import time

    if rank == 1 and step == 3:
        print(f"SCENARIO_READY rank={rank} tokenize", flush=True)
        while True:
            time.sleep(0.2)
    return [step] * 4


def main() -> None:
    import faulthandler
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "15"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(8):
        faulthandler.dump_traceback_later(6, exit=False, file=sys.stderr)
        t = torch.tensor(tokenize_batch(rank, step), dtype=torch.float32)
        if rank != 1 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce", flush=True)
        dist.all_reduce(t)
        faulthandler.cancel_dump_traceback_later()
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
