"""WORLD_SIZE is 3 but only ranks 0 and 1 are started (the third task or node never came up).

Launched like ``srun python train.py``: one process per rank, RANK / WORLD_SIZE from the
environment, all output in one console. Rank 0 hosts the TCPStore and gives up waiting:
``Timed out after N seconds waiting for clients. 2/3 clients joined.``; rank 1 times out
waiting for rank 2's Gloo address in the store.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "ranks": [0, 1], "timeout_s": 60}
EXPECT = {
    "cause": "missing_ranks",
    "ranks": [2],
    "notes": "WORLD_SIZE=3, only RANK=0 and RANK=1 launched: rank 2 never joins",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"rank={rank} init_process_group world_size={world_size}", flush=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=6))
    t = torch.ones(1)
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
