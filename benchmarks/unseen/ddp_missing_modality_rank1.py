"""A two-tower (image + text) model under DDP (3 ranks, ``find_unused_parameters=False``):
``forward(image, text)`` adds the text tower's output only when the batch has captions
(``if text is not None``). At step 2 rank 1's batch is image-only (its shard has uncaptioned
images), so its text tower takes no part in the loss: DDP on rank 1 never gets those
gradients, its reduction of that bucket never starts, and its next forward (step 3) raises
``RuntimeError: Expected to have finished reduction in the prior iteration before starting a
new one. This error indicates that your module has parameters that were not used in producing
loss ... Parameter indices which did not receive grad for rank 1: 2 3``. Ranks 0, 2 wait in
step 2's gradient all-reduce in backward and lose their peer. torchrun ``--tee 3``.

Truth: unused parameters, on rank 1 only (a data-dependent branch skipped the text tower on
that rank); the others' Gloo errors are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "unused_parameters",
    "ranks": [1],
    "notes": "rank 1's step-2 batch has no captions: text tower unused; it raises at step 3",
}


def make_model() -> "object":
    import torch

    class TwoTower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.image = torch.nn.Linear(8, 8)
            self.text = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, image: "torch.Tensor", text: "torch.Tensor | None") -> "torch.Tensor":
            h = self.image(image)
            if text is not None:
                h = h + self.text(text)
            return self.head(h)

    return TwoTower()


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
    for step in range(6):
        g = torch.Generator().manual_seed(10 * rank + step)
        image = torch.randn(4, 8, generator=g)
        text = torch.randn(4, 8, generator=g)
        if rank == 1 and step == 2:
            text = None  # an image-only batch: no captions in this part of rank 1's shard
            print(f"rank {rank} step {step}: batch without captions", flush=True)
        loss = model(image, text).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
