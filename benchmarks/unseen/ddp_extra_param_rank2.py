"""Rank 2 (of 3) builds its model with an extra layer (a feature flag read from its own
environment), so DDP's construction-time check fails. torchrun ``--tee 3``.

Truth: the ranks disagree on the model: ``config_mismatch`` naming rank 2 (the rank whose model
differs). ``collective_mismatch`` [2] is accepted too (DDP verifies the model with a collective
that then sees different shapes); ``rank_crashed`` is not: every rank raises the same check.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "config_mismatch",
    "also": ["collective_mismatch"],
    "ranks": [2],
    "notes": "rank 2's model has 2 more parameters: DDP constructor check",
}


def build_model(extra_head: bool) -> "object":
    import torch

    layers = [torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)]
    if extra_head:
        layers.append(torch.nn.Linear(2, 2))
    return torch.nn.Sequential(*layers)


def main() -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    model = build_model(extra_head=(rank == 2))
    print(f"rank {rank}: model has {sum(1 for _ in model.parameters())} tensors", flush=True)
    ddp = DDP(model)
    print(f"rank {rank}: DDP ready {type(ddp).__name__}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
