"""HANG: rank 2 (of 3) broadcasts the initial weights from ``src=1`` (it reads ``src`` from a config
key that is set differently on its node), ranks 0, 1 from ``src=0``. Under torchrun all three
block in ``broadcast`` until the Gloo timeout (with 4-element tensors under ``mp.spawn`` Gloo
aborted a process at once instead). torchrun ``--log-dir`` and ``--tee 3``.

Truth: collective mismatch, rank 2 the odd one (broadcast src 1 vs 0).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [2],
    "notes": "broadcast(src=1) on rank 2, broadcast(src=0) on ranks 0, 1",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 4)
    src = 1 if rank == 2 else 0
    print(f"rank {rank}: syncing initial weights from rank {src}", flush=True)
    print(f"SCENARIO_READY rank={rank} broadcast", flush=True)
    for p in model.parameters():
        dist.broadcast(p.data, src=src)
    print(f"rank {rank}: weights synced", flush=True)
    for step in range(3):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
