"""NEAR-MISS, healthy: one process per rank (srun-like, ``rank<N>.log`` each); rank 0, which
hosts the TCPStore, starts 5 s after the others (it loads a big config first), so ranks 1, 2
try to connect before anybody listens (torch 2.13 retries quietly; older releases log ``The
client socket has failed to connect to ... Connection refused`` retries). Then everyone joins,
trains 4 steps and exits 0.

Truth: nothing failed (``None``): a late store host is normal start-up.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": None,
    "ranks": None,
    "notes": "connect retries before the store exists; exit 0 everywhere",
}


def main() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if rank == 0:
        print("rank 0: loading config (5 s)", flush=True)
        time.sleep(5)
    timeout = max(30.0, float(os.environ.get("UNSEEN_TIMEOUT", "10")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    for step in range(4):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
