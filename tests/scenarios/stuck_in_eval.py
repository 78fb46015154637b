"""HANG: after step 2, rank 0 runs ``evaluate()`` (a long loop) that the other ranks don't,
while ranks 1 and 2 go on to step 3 and wait in ``dist.all_reduce`` for it. With a 300 s
Gloo timeout nothing fails for minutes: the job just stops making progress.
Launched with ``torchrun --log-dir ... --tee 3``.
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 3,
    "log_dir": True,
    "tee": True,
    "hang": True,
    "timeout_s": 40,
}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [0],
    "frame": "evaluate",
    "notes": "ranks 1, 2 in all_reduce (step 3); rank 0 in evaluate() -> time.sleep",
}


def evaluate(rank: int) -> None:
    import time

    print(f"SCENARIO_READY rank={rank} evaluating", flush=True)
    for _batch in range(1_000_000):  # a validation set far bigger than intended
        time.sleep(0.5)


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    for step in range(10):
        if step == 3:
            if rank == 0:
                evaluate(rank)  # only rank 0 evaluates, and it takes "forever"
            else:
                print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
