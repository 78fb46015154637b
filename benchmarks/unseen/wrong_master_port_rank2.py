"""One process per rank (srun-like, ``rank<N>.log`` each): rank 2 of 3 computes its
``MASTER_PORT`` from a different base (its launch script adds 1), so it tries to reach a
port nothing listens on, while ranks 0 and 1 (rank 0 hosts the store) wait in init for the
third rank to join. Both sides time out (``UNSEEN_TIMEOUT``).

Truth: a configuration mismatch on rank 2 (its master port differs). Also accepted, naming
rank 2: ``master_unreachable`` (what rank 2 sees) and ``missing_ranks`` (what ranks 0, 1 see).
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": "config_mismatch",
    "also": ["master_unreachable", "missing_ranks"],
    "ranks": [2],
    "notes": "MASTER_PORT+1 on rank 2 only",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if rank == 2:
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
    print(f"rank {rank}: MASTER_ADDR={os.environ['MASTER_ADDR']} "
          f"MASTER_PORT={os.environ['MASTER_PORT']} WORLD_SIZE={os.environ['WORLD_SIZE']}",
          flush=True)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
