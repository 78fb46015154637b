"""A gradient guard registered with ``Tensor.register_hook`` on the head's weight of a DDP
model (3 ranks) raises ``FloatingPointError: gradient explosion in head.weight: norm ...`` when
a gradient's norm exceeds 1e3. At step 3 rank 1's batch has labels in the wrong units (x1e6), so its
hook raises *during ``loss.backward()``*, from inside the autograd engine; ranks 0, 2 wait
in DDP's gradient all-reduce in their own backward and lose their peer. torchrun
``--log-dir --redirects 3``: the workers' output is only in the per-rank files.

Truth: rank 1 crashed (an exception in its backward hook); the others' errors are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "redirects": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "exception": "FloatingPointError: gradient explosion in head.weight",
    "notes": "raised in a tensor hook during backward on rank 1 at step 3; 0, 2 in DDP allreduce",
}


def make_guard(name: str) -> "object":
    def check_grad(grad: "object") -> None:
        norm = grad.norm().item()  # type: ignore[attr-defined]
        if norm > 1e3:
            raise FloatingPointError(f"gradient explosion in {name}: norm {norm:.3e}")

    return check_grad


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
    net = torch.nn.Sequential()
    net.add_module("body", torch.nn.Linear(8, 16))
    net.add_module("act", torch.nn.Tanh())
    net.add_module("head", torch.nn.Linear(16, 1))
    net.head.weight.register_hook(make_guard("head.weight"))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        g = torch.Generator().manual_seed(10 * rank + step)
        x = torch.randn(16, 8, generator=g)
        y = torch.randn(16, 1, generator=g)
        if rank == 1 and step == 3:
            y = y * 1e6  # labels from a feed that changed units
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
