"""One process per rank (srun-like, ``rank<N>.log`` each), 3 ranks. Rank 2's launch wrapper
exports ``WORLD_SIZE`` from a stale variable of an earlier 4-task allocation, so rank 2 starts
with ``WORLD_SIZE=4`` while ranks 0, 1 have 3 (each rank prints its env at start). All three
reach the store; rank 2 then waits for the address of a rank 3 that will never exist
(``DistStoreError: wait timeout after ...ms, keys: /default_pg/0//cpu//0/3``), and ranks 0, 1
fail to build the Gloo mesh with rank 2 (``Gloo connectFullMesh failed ... Connect timeout``).

Truth: a configuration mismatch on rank 2 (its WORLD_SIZE differs from the others'). Not
``missing_ranks``: every rank of the real job (0-2) started and joined the store; the "rank 3"
rank 2 waits for never existed.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": "config_mismatch",
    "ranks": [2],
    "notes": "WORLD_SIZE=4 on rank 2, 3 on ranks 0, 1",
}


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if rank == 2:
        os.environ["WORLD_SIZE"] = "4"  # stale SLURM_NTASKS from an earlier allocation
    print(f"rank {rank}: MASTER_ADDR={os.environ['MASTER_ADDR']} "
          f"MASTER_PORT={os.environ['MASTER_PORT']} WORLD_SIZE={os.environ['WORLD_SIZE']} "
          f"RANK={os.environ['RANK']}", flush=True)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    print(f"rank {rank}: process group ready, world size {dist.get_world_size()}", flush=True)
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
