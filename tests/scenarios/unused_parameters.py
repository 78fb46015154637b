"""DDP with a parameter that never takes part in the loss: the second iteration fails with
"Expected to have finished reduction in the prior iteration"; TORCH_DISTRIBUTED_DEBUG=INFO
makes DDP name the parameter ("Parameters which did not receive grad for rank N: head.bias")."""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 2,
    "tee": True,
    "env": {"TORCH_DISTRIBUTED_DEBUG": "INFO"},
    "timeout_s": 60,
}
EXPECT = {
    "cause": "unused_parameters",
    "ranks": [0, 1],
    "notes": "aux_head is defined but unused; find_unused_parameters=False",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(8, 8)
            self.aux_head = torch.nn.Linear(8, 2)  # forgotten: never used in forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank={dist.get_rank()} step={step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
