"""A DDP model (3 ranks) whose blocks run under activation checkpointing
(``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)``) and use a hand-written fused
RMSNorm (a ``torch.autograd.Function``). Its ``backward`` validates the incoming gradient and
raises ``FloatingPointError: RMSNormFn.backward: grad_output has N non-finite values`` when it
is not finite. At step 3 rank 2's batch has an ``inf`` feature (a corrupt sample in its shard),
so the loss and every gradient are NaN on rank 2: the error is raised *inside
``loss.backward()``*, during the checkpoint's recomputation-and-backward, from the autograd
engine (a nested ``torch.autograd.backward`` call in the traceback). Ranks 0, 1 wait in DDP's
gradient all-reduce inside their own backward and lose their peer. torchrun ``--tee 3
--log-dir``.

Truth: rank 2 crashed first (FloatingPointError in the custom Function's backward); the
others' Gloo errors are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "frame": "backward",
    "notes": "rank 2 FloatingPointError in RMSNormFn.backward under checkpoint; 0, 1 in DDP "
             "all-reduce",
}


def make_model() -> "object":
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class RMSNormFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):  # type: ignore[override]
            rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, weight, rstd)
            return x * rstd * weight

        @staticmethod
        def backward(ctx, grad_out):  # type: ignore[override]
            x, weight, rstd = ctx.saved_tensors
            bad = int((~torch.isfinite(grad_out)).sum())
            if bad:
                raise FloatingPointError(
                    f"RMSNormFn.backward: grad_output has {bad} non-finite values "
                    f"(shape {tuple(grad_out.shape)})"
                )
            xhat = x * rstd
            gw = (grad_out * xhat).sum(0)
            gx_hat = grad_out * weight
            gx = rstd * (gx_hat - xhat * (gx_hat * xhat).mean(-1, keepdim=True))
            return gx, gw, None

    class Block(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.fc = nn.Linear(dim, dim)

        def forward(self, x):  # type: ignore[override]
            return x + torch.tanh(self.fc(RMSNormFn.apply(x, self.weight, 1e-6)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block(16) for _ in range(3))
            self.head = nn.Linear(16, 1)

        def forward(self, x):  # type: ignore[override]
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=True)
            return self.head(x)

    return Net()


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        g = torch.Generator().manual_seed(100 * rank + step)
        x = torch.randn(8, 16, generator=g, requires_grad=True)
        y = torch.randn(8, 1, generator=g)
        if rank == 2 and step == 3:
            x.data[5, 7] = float("inf")  # a corrupt sample in rank 2's shard
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
