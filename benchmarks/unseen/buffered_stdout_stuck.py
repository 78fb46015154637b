"""HANG with block-buffered stdout: every rank ``print``s without ``flush`` and torchrun pipes
its workers' output, so a rank's lines come out only in 4-8 KB blocks. Rank 2 (of 3) stalls
in ``compute_metrics`` (a pure-Python loop over a huge validation set) after step 3; ranks 0,
1 wait in ``all_reduce``. When the others time out, torchrun SIGTERMs rank 2 and its buffer
(everything it printed) is lost: in the logs rank 2 never says anything. Plain torchrun.
The ready markers go to stderr (unbuffered), as warnings would.

Truth: rank 2 stuck outside the collective (``compute_metrics``).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [2],
    "frame": "compute_metrics",
    "notes": "rank 2's buffered stdout is lost; ranks 0, 1 in all_reduce",
}


def compute_metrics(rank: int) -> float:
    import sys
    import time

    print(f"rank {rank}: computing validation metrics")
    print(f"SCENARIO_READY rank={rank} compute_metrics", file=sys.stderr, flush=True)
    total = 0.0
    while True:  # 40M samples, one at a time
        for i in range(100_000):
            total += i * 1e-9
        time.sleep(0.05)
    return total


def main() -> None:
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(8):
        t = torch.ones(4)
        if step == 4:
            if rank == 2:
                compute_metrics(rank)
            else:
                print(f"SCENARIO_READY rank={rank} all_reduce", file=sys.stderr, flush=True)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
