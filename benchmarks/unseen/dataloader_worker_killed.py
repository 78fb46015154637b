"""A DataLoader worker process of rank 1 (of 2) is SIGKILLed, as the host's OOM killer picks the
biggest process (here the worker kills itself with SIGKILL at sample 6). The main process of
rank 1 raises ``RuntimeError: DataLoader worker (pid N) is killed by signal: Killed.``; rank 0
waits in ``all_reduce`` and loses its peer. torchrun ``--tee 3``.

Truth: out of (host) memory on rank 1 (a worker killed by SIGKILL with no traceback is the OOM
killer's signature). ``rank_crashed`` [1] accepted (right rank, less precise).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "out_of_memory",
    "also": ["rank_crashed"],
    "ranks": [1],
    "notes": "DataLoader worker of rank 1 killed by SIGKILL",
}


class Images:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> "object":
        import os
        import signal

        import torch

        if self.rank == 1 and index == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((4,), float(index))


def main() -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    loader = DataLoader(Images(rank), batch_size=2, num_workers=2)
    for step, batch in enumerate(loader):
        dist.all_reduce(batch)
        print(f"rank {rank} step {step} sum {batch.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
