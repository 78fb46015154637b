"""HANG: a four-stage pipeline passes activations forward with ``send``/``recv``: stage ``r``
receives from ``r - 1`` and sends to ``r + 1``. Stage 2 computes its upstream peer with the wrong
sign (``recv(src=rank + 1)``): it waits for stage 3, which waits for it, while stage 1's send to
it is never received (and stage 0's next send to stage 1 with it). Every rank blocks in a
point-to-point call; the stacks' call arguments (``src``/``dst``) say who waits on whom. Gloo
timeout 300 s; collected while hung. Plain ``torchrun``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [2],
    "frame": "recv",
    "notes": "rank 2 recv(src=3); rank 0 send(dst=1), rank 1 send(dst=2), rank 3 recv(src=2)",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    upstream = rank + 1 if rank == 2 else rank - 1
    print(f"SCENARIO_READY rank={rank}", flush=True)
    for step in range(2):
        act = torch.full((4096,), float(step))
        if rank > 0:
            dist.recv(act, src=upstream)
        if rank < world - 1:
            dist.send(act * 2, dst=rank + 1)
        print(f"rank={rank} step={step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
