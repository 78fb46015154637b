"""Near-miss: the first launch hits a busy master port, the relaunch (port freed) succeeds.

Both attempts append to the same console.log, as a user re-running in one terminal or a
SLURM requeue writing to the same ``.out`` file. The failure is history, not the cause.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "attempts": 2, "timeout_s": 60}
SETUP = "occupy_master_port_first_attempt"
EXPECT = {
    "cause": None,
    "ranks": [],
    "notes": "attempt 1 fails with EADDRINUSE, attempt 2 exits 0: the last run is healthy",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    for step in range(3):
        t = torch.ones(1) * step
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.item()}", flush=True)
    dist.destroy_process_group()
    print(f"rank={rank} done", flush=True)


if __name__ == "__main__":
    main()
