"""Near-miss: 3 ranks train a tiny DDP model for a few steps, all_reduce a metric, exit 0.

Launched with ``torchrun --tee 3``: worker lines reach the console prefixed ``[default<N>]:``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {"cause": None, "ranks": [], "notes": "clean exit 0; nothing to diagnose"}


def main() -> None:
    import gc
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        metric = loss.detach().clone()
        dist.all_reduce(metric)
        print(
            f"rank={rank} step={step} loss={metric.item() / dist.get_world_size():.4f}", flush=True
        )
    # DDP holds the process group: release it so that destroy_process_group() frees it and
    # joins Gloo's worker threads. Otherwise a worker may free the last all_reduce's tensors
    # while the interpreter shuts down and abort the process (pytorch/pytorch#179291).
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    print(f"rank={rank} done", flush=True)


if __name__ == "__main__":
    main()
