"""Nothing fails: the terminal that started torchrun closes mid-training. The agent gets SIGHUP
("Received 1 death signal, shutting down workers", or ``Signals.SIGHUP`` in newer releases),
forwards it to its workers ("closing signal SIGHUP") and exits. Every rank was healthy.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "signal": "SIGHUP", "timeout_s": 60}
EXPECT = {
    "cause": "job_terminated",
    "ranks": [],
    "notes": "the launcher's SIGHUP, not a rank's failure",
}


def main() -> None:
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    for step in range(10_000):
        t = torch.ones(4)
        dist.all_reduce(t)
        if step == 2:
            print(f"SCENARIO_READY rank={rank}", flush=True)
        print(f"rank={rank} step={step} loss={1.0 / (step + 1):.4f}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
