"""Too many open files on one node: one process per rank (srun-like, ``rank<N>.log`` each), 3
ranks. Each rank trains from a ``DataLoader`` with ``num_workers=2, prefetch_factor=4`` whose
samples are dicts of 32 small tensors (one per feature column); with torch's default
``file_descriptor`` sharing strategy every tensor a worker sends travels as a file descriptor.
Rank 2's node has a low open-files limit (``ulimit -n 128`` in its prolog; here rank 2 lowers its
own soft ``RLIMIT_NOFILE`` to 128 before building the loader, and logs its limit like every
rank does). Its workers and main process run out of descriptors: the workers' feeder threads
print ``OSError: [Errno 24] Too many open files`` / ``RuntimeError: unable to open shared
memory object ... Too many open files (24)`` tracebacks (the workers live on), and the main
process dies in ``DataLoader.__next__`` -> ``recvfds`` with a bare ``EOFError``. Ranks 0, 1 wait
in ``all_reduce`` and fail with Gloo connection errors.

Truth: rank 2 crashed (descriptor exhaustion under the DataLoader); the others are symptoms.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "notes": "rank 2 RLIMIT_NOFILE 128: EOFError in recvfds (+ worker Errno 24 noise)",
}


class Features:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> dict:
        import torch

        return {f"col{k:02d}": torch.full((4,), float(i + k)) for k in range(32)}


def main() -> None:
    import os
    import resource
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    if rank == 2:  # this node's prolog sets `ulimit -n 128`
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    print(f"rank {rank}: open files limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}",
          flush=True)
    loader = DataLoader(Features(rank), batch_size=None, num_workers=2, prefetch_factor=4)
    w = torch.zeros(32)
    for step, sample in enumerate(loader):
        x = torch.stack([sample[k].mean() for k in sorted(sample)])
        dist.all_reduce(x)
        w -= 1e-4 * x
        if step % 50 == 0:
            print(f"rank {rank} step {step} w0 {w[0].item():.4f}", flush=True)
        if step == 300:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
