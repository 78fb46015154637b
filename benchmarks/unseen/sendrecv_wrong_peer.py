"""HANG: a pipeline of 3 stages passes activations with ``send``/``recv``: stage 0 sends to 1,
1 receives from 0 and sends to 2, 2 receives from 1. Rank 1 computes its upstream peer with an
off-by-one (``recv(src=rank + 1)``), so it waits for rank 2, which waits for rank 1, while
rank 0's ``send`` to 1 is never matched. Every rank blocks in a point-to-point op until the
Gloo timeout. torchrun ``--log-dir``.

Truth: a collective (point-to-point) mismatch, rank 1 the odd one (it receives from the wrong
peer). ``rank_stuck_outside_collective`` is not right: every rank is in a communication call.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1],
    "notes": "rank 1 recv(src=2) instead of recv(src=0); rank 0 in send, rank 2 in recv(src=1)",
}


def stage(rank: int, world: int, x: "object") -> "object":
    import torch.distributed as dist

    if rank > 0:
        src = rank + 1 if rank == 1 else rank - 1  # the off-by-one on stage 1
        print(f"SCENARIO_READY rank={rank} recv from {src}", flush=True)
        dist.recv(x, src=src)  # type: ignore[arg-type]
    if rank < world - 1:
        if rank == 0:
            print(f"SCENARIO_READY rank={rank} send to {rank + 1}", flush=True)
        dist.send(x, dst=rank + 1)  # type: ignore[arg-type]
    return x


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    for micro in range(3):
        x = stage(rank, world, torch.full((4,), float(micro)))
        print(f"rank {rank} micro-batch {micro} done {x.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
