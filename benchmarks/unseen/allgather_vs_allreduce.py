"""HANG: every 3 steps rank 0 gathers the per-rank losses with ``all_gather`` to log them,
while ranks 1, 2 (which do not log) call the step's ``all_reduce``. Gloo does not check: all
three block until the timeout (``Timed out waiting ...ms for send/recv operation``), every rank
alike. torchrun ``--tee 3``, no ``TORCH_DISTRIBUTED_DEBUG``.

Truth: collective mismatch, rank 0 is the odd one (``all_gather`` vs ``all_reduce``).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [0],
    "notes": "rank 0 in all_gather (log_losses), ranks 1, 2 in all_reduce",
}


def log_losses(loss: "object", world: int) -> None:
    import torch
    import torch.distributed as dist

    print("SCENARIO_READY rank=0 all_gather", flush=True)
    out = [torch.zeros_like(loss) for _ in range(world)]  # type: ignore[arg-type]
    dist.all_gather(out, loss)  # type: ignore[arg-type]
    print("losses", [t.item() for t in out], flush=True)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(1, 10):
        loss = torch.tensor([float(rank + step)])
        if step % 3 == 0 and rank == 0:
            log_losses(loss, world)
        if step % 3 == 0 and rank != 0:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(loss)
        print(f"rank {rank} step {step} loss {loss.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
