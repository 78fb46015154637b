"""DDP (3 ranks) with gradient accumulation: each rank reads ``grad_accum_steps`` from its
node's ``train.yaml`` and wraps the backward of non-final micro-batches in ``ddp.no_sync()``.
Rank 2's node has an older config with ``grad_accum_steps=2`` (the others 1), so rank 2
all-reduces gradients only every second micro-batch. Gloo pairs collectives by order, so
nothing fails at first: rank 2's gradient all-reduce of micro-batch 1 completes with the
others' micro-batch 0, and so on, silently. After its 8 micro-batches rank 2 has done 4
gradient all-reduces and goes to the end-of-epoch ``dist.barrier()``, while ranks 0, 1 wait in
the gradient all-reduce of micro-batch 4 inside ``loss.backward()``. The job dies at the Gloo
timeout. Every rank logs its config at start and ``micro m loss ... sync=True/False`` per
micro-batch. torchrun ``--log-dir --redirects 3`` (worker output only in the per-rank files).

Truth: collective mismatch, rank 2 the odd one (half as many gradient all-reduces, then a
barrier the others never reach). ``config_mismatch`` [2] is accepted: the root is rank 2's
different ``grad_accum_steps``. Not ``rank_stuck_outside_collective``: every rank is in a
collective.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "redirects": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["config_mismatch"],
    "ranks": [2],
    "notes": "grad_accum_steps=2 on rank 2 (1 elsewhere): rank 2 in barrier, 0, 1 in DDP "
             "all-reduce in backward",
}

MICRO_BATCHES = 8


def load_config(rank: int) -> dict[str, float]:
    cfg = {"lr": 0.05, "batch_size": 4, "grad_accum_steps": 1}
    if rank == 2:
        cfg["grad_accum_steps"] = 2  # this node's train.yaml is from an older run
    return cfg


def main() -> None:
    import contextlib
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    cfg = load_config(rank)
    print(f"rank {rank}: config {cfg}", flush=True)
    torch.manual_seed(rank)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"])
    accum = int(cfg["grad_accum_steps"])
    for micro in range(MICRO_BATCHES):
        x = torch.randn(int(cfg["batch_size"]), 16)
        sync = (micro + 1) % accum == 0
        ctx = contextlib.nullcontext() if sync else ddp.no_sync()
        with ctx:
            loss = ddp(x).pow(2).mean() / accum
            loss.backward()
        if sync:
            opt.step()
            opt.zero_grad()
        print(f"rank {rank} micro {micro} loss {loss.item():.4f} sync={sync}", flush=True)
    print(f"rank {rank}: epoch done, waiting for the other ranks", flush=True)
    dist.barrier()
    if rank == 0:
        torch.save(ddp.module.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
