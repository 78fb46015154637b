"""One process per rank (srun-like, ``rank<N>.log`` each), 3 ranks. The training script takes
its rank from the MPI variables when present (``PMI_RANK``, then ``OMPI_COMM_WORLD_RANK``, then
``RANK``), so the same script runs under ``mpirun`` too. Task 2's shell carries a stale
``PMI_RANK=1`` (an MPI module loaded in its profile on that node; here the job sets it for task
2, standing in for that environment), so task 2 joins as *rank 1*: two processes claim rank 1
and nobody is rank 2. Every process prints the rank it resolved and where from. All three
reach the store; the Gloo rendezvous then waits for rank 2's address, which never comes, until
the init timeout (``UNSEEN_TIMEOUT``) on every process.

Truth: a configuration mismatch on task 2 (launched as rank 2, it resolved rank 1 from a stale
variable). ``missing_ranks`` [2] is accepted: from the group's side rank 2 never joined, and
naming rank 2 points at the task to look at. Ranks 0 and 1 are symptoms.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": "config_mismatch",
    "also": ["missing_ranks"],
    "ranks": [2],
    "notes": "task RANK=2 resolves rank 1 from a stale PMI_RANK; two rank 1s, no rank 2",
}


def resolve_rank() -> tuple[int, str]:
    import os

    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK"):
        if var in os.environ:
            return int(os.environ[var]), var
    raise RuntimeError("no rank in the environment")


def main() -> None:
    import os
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if os.environ["RANK"] == "2":
        os.environ["PMI_RANK"] = "1"  # stale, from the node's MPI module
    rank, source = resolve_rank()
    world = int(os.environ["WORLD_SIZE"])
    print(f"rank {rank} of {world} (from {source}) on {socket.gethostname()} pid {os.getpid()} "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))
    print(f"rank {rank}: process group ready", flush=True)
    for step in range(3):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
