"""Rank 0 evaluates on its own (with a progress bar naming its rank) while ranks 1 and 2 go on
to the next all_reduce; the process group timeout (4 s here, 30 min in real jobs) is shorter
than the evaluation, so Gloo times out on ranks 1 and 2 ("Timed out waiting 4000ms for recv
operation to complete"), they exit, and torchrun stops rank 0. No stack dumps: the logs alone
must name rank 0 and its evaluation, not the ranks whose timeout ended the job.
Launched with ``torchrun --tee 3``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [0],
    "notes": "rank 0's last line is its own evaluation; ranks 1, 2 time out in all_reduce",
}


def evaluate(rank: int) -> None:
    import time

    for batch in range(1, 41):
        print(f"Evaluating on rank {rank}: batch {batch}/40", flush=True)
        time.sleep(0.5)


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=4))
    rank = dist.get_rank()
    for step in range(4):
        if step == 2 and rank == 0:
            evaluate(rank)  # only rank 0 evaluates, and it takes longer than the timeout
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
