"""torchrun ``--max-restarts 1``: rank 1 (of 2) raises ``ZeroDivisionError`` at step 2 in every
attempt (a deterministic bug), so torchrun restarts the group once (two attempts) before giving
up. On a loaded machine the restarted group's Gloo init itself can time out ("Gloo
connectFullMesh failed ... Connect timeout"), a second failure of another kind in the same log.
torchrun ``--tee 3``.

Truth: rank 1 crashed (the same exception each attempt).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "timeout_s": 90,
          "logs_timeout_s": 240, "torchrun_args": ["--max-restarts", "1"]}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "ZeroDivisionError on rank 1 in attempt 0 (and 1, unless its init fails)",
}


def lr_at(step: int, warmup: int) -> float:
    return min(1.0, step / warmup)


def main() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    print(f"rank {rank}: attempt {attempt}", flush=True)
    for step in range(6):
        warmup = 0 if (rank == 1 and step == 2) else 10
        if rank == 1 and step == 2:
            time.sleep(1)
        t = torch.ones(4) * lr_at(step, warmup)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
