"""Under ``torch.multiprocessing.spawn`` (3 ranks), a debugging run with
``torch.autograd.set_detect_anomaly(True)`` on every rank. The DDP model L2-normalises its
embeddings (``h / h.norm(dim=1, keepdim=True)``, no epsilon). At step 2 rank 1's batch holds an
all-zero row (a padding sample), so its embedding is 0/0 and its loss NaN: anomaly mode first
prints a ``UserWarning: Error
detected in PowBackward0. Traceback of forward call that caused the error:`` with the *forward*
stack (``File ..., in train_step`` / ``loss = model(x).pow(2).mean()``), then rank 1's backward
raises ``RuntimeError: Function 'PowBackward0' returned nan values in its 0th output.``; ranks
0 and 2 wait in DDP's gradient all-reduce until spawn terminates them, and the parent re-raises
rank 1's traceback (``ProcessRaisedException: -- Process 1 terminated with the following
error``).

Truth: rank 1 crashed (the RuntimeError from anomaly mode in its backward pass); the warning
traceback is the forward call that produced the NaN, not a second failure.
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "frame": "train_step",
    "notes": "RuntimeError: Function 'PowBackward0' returned nan values, rank 1 step 2",
}

WORLD_SIZE = 3


def make_model() -> "object":
    import torch

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 16, bias=False)
            self.head = torch.nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.proj(x)
            h = h / h.norm(dim=1, keepdim=True)  # no eps: a zero row gives 0/0
            return self.head(h)

    return Embedder()


def batch_for(rank: int, step: int) -> "object":
    import torch

    x = torch.randn(4, 8)
    if rank == 1 and step == 2:
        x[3] = 0.0  # a padding sample that slipped through the collate function
    return x


def train_step(model: "object", opt: "object", x: "object") -> float:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def worker(rank: int) -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    torch.autograd.set_detect_anomaly(True)
    torch.manual_seed(0)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    for step in range(5):
        x = batch_for(rank, step)
        if rank == 1 and step == 2:
            time.sleep(1)  # the others are in their backward's all-reduce by now
        loss = train_step(model, opt, x)
        print(f"rank {rank} step {step} loss {loss:.4f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
