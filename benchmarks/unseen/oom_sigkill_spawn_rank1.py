"""Under ``torch.multiprocessing.spawn`` (3 ranks): the host's OOM killer SIGKILLs rank 1's
main process. Every rank keeps a "hard example" replay buffer of the batches whose loss is
above a threshold; rank 1's shard is all hard examples, so its buffer grows by 64 MB a step
while the others keep almost nothing. Every rank logs its resident memory each step, the way
trainers do (``rank 1 step 3 loss 4.1 rss 487 MB replay 256 MB``): rank 1's grows steadily.
When its RSS passes the node's limit (here: 350 MB above its start, reached at step 4) the
kernel kills it with SIGKILL (here the rank sends SIGKILL to itself, standing in for the OOM
killer): no traceback, no message. spawn reports ``ProcessExitedException: process 1
terminated with signal SIGKILL`` and stops the others (waiting in ``all_reduce``).

Truth: out of (host) memory on rank 1: a rank killed by SIGKILL while its logged memory climbs
is the OOM killer's signature. ``rank_crashed`` [1] is accepted (right rank, less precise).
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "out_of_memory",
    "also": ["rank_crashed"],
    "ranks": [1],
    "notes": "rank 1 SIGKILL (self, as the OOM killer) with rss climbing 64 MB/step in the log",
}

WORLD_SIZE = 3


def rss_mb() -> float:
    import os

    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(rank: int) -> None:
    import os
    import signal
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    replay: list = []
    start = rss_mb()
    limit = start + 350  # the node's memory limit, as far as this rank is concerned
    for step in range(10):
        batch = torch.rand(4096, 4096)  # 64 MB
        loss = 4.0 + step * 0.01 if rank == 1 else 0.5 + 0.01 * rank
        if loss > 2.0:  # hard example: keep it for replay
            replay.append(batch.clone())
        held = sum(t.numel() * 4 for t in replay) / 2**20
        now = rss_mb()
        print(f"rank {rank} step {step} loss {loss:.2f} rss {now:.0f} MB replay {held:.0f} MB",
              flush=True)
        if now > limit:
            time.sleep(0.5)  # the others are in all_reduce by now
            os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
        t = torch.tensor([loss])
        dist.all_reduce(t)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
