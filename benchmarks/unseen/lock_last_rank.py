"""HANG: the last rank (3 of 4) deadlocks on a ``threading.Lock``: its metrics logger takes
the lock, and, when its buffer is full (rank 3 logs more: it owns the extra metrics), calls
``flush()``, which takes the same non-reentrant lock again. Ranks 0-2 wait in ``all_reduce``.
Plain torchrun (unprefixed output).

Truth: rank 3 stuck outside the collective, in ``MetricsLogger.flush`` (``lock.acquire``).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [3],
    "frame": "flush",
    "notes": "rank 3 in MetricsLogger.flush -> Lock.acquire (self-deadlock); 0-2 in all_reduce",
}


class MetricsLogger:
    def __init__(self, rank: int, capacity: int) -> None:
        import threading

        self.rank = rank
        self.capacity = capacity
        self.buf: list[str] = []
        self.lock = threading.Lock()

    def log(self, **metrics: float) -> None:
        with self.lock:
            self.buf.append(repr(metrics))
            if len(self.buf) >= self.capacity:
                if self.rank == 3:
                    print(f"SCENARIO_READY rank={self.rank} flushing metrics", flush=True)
                self.flush()  # takes self.lock again: deadlock

    def flush(self) -> None:
        with self.lock:
            print(f"rank {self.rank}: {len(self.buf)} metrics", flush=True)
            self.buf.clear()


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    metrics = MetricsLogger(rank, capacity=4 if rank == 3 else 1000)
    for step in range(10):
        loss = torch.tensor([float(step + rank)])
        if rank != 3 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(loss)
        metrics.log(step=step, loss=loss.item())
        print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
