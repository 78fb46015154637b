"""Rank 1 (of 3) crashes; the others' preemption handlers make the teardown noisy. Every rank
installs a SIGTERM handler (as jobs on preemptible nodes do) that prints ``SIGTERM received:
waiting for the pending checkpoint write`` and joins its asynchronous checkpoint writer before
exiting with ``sys.exit(143)``. After step 1 every rank starts an async save of its shard;
rank 2's node-local scratch disk is hung, so its writer never finishes. At step 3 rank 1 opens a
data shard that does not exist (``FileNotFoundError``) while ranks 0, 2 are computing; torchrun
SIGTERMs ranks 0 and 2: rank 0's handler exits at once (code 143), rank 2's handler waits for
its writer forever, and after 30 s torchrun kills it (``Unable to shutdown process ... via
Signals.SIGTERM, forcefully exiting via Signals.SIGKILL``). Plain torchrun (no prefixes;
every line says its rank).

Truth: rank 1 crashed first (FileNotFoundError). Not ``out_of_memory`` or a crash of rank 2:
the SIGKILL is torchrun's, after rank 2 ignored its SIGTERM while shutting down; not
``job_terminated``: the SIGTERMs come from torchrun reacting to rank 1's failure.
"""

import threading

LAUNCH = {"launcher": "torchrun", "nproc": 3, "timeout_s": 90}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "exception": "FileNotFoundError",
    "notes": "rank 1 FileNotFoundError at step 3; rank 0 exits 143 in its SIGTERM handler; "
             "rank 2's handler hangs, SIGKILLed by torchrun after 30 s",
}


class AsyncCheckpointer:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.thread: threading.Thread | None = None

    def save_async(self, state: dict[str, object], path: str, hung_disk: bool) -> None:
        def write() -> None:
            import time

            import torch

            if hung_disk:
                time.sleep(3600)  # the scratch mount does not answer
            torch.save(state, path)

        self.thread = threading.Thread(target=write, daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()


def install_preemption_handler(rank: int, ckpt: AsyncCheckpointer) -> None:
    import signal
    import sys

    def on_sigterm(signum: int, frame: object) -> None:
        print(f"[rank {rank}] SIGTERM received: waiting for the pending checkpoint write",
              flush=True)
        ckpt.wait()
        print(f"[rank {rank}] checkpoint flushed, exiting", flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def read_shard(rank: int, step: int) -> "object":
    import torch

    if rank == 1 and step == 3:
        with open(f"data/shard-{rank:05d}-part{step}.bin", "rb") as fh:
            return torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8).float()
    return torch.ones(8) * step


def compute(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.1)


def main() -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    ckpt = AsyncCheckpointer(rank)
    install_preemption_handler(rank, ckpt)
    for step in range(6):
        print(f"[rank {rank}] step {step}: loading batch", flush=True)
        batch = read_shard(rank, step)
        compute(6.0 if step == 3 else 0.2)
        t = batch.sum().reshape(1)
        dist.all_reduce(t)
        print(f"[rank {rank}] step {step} loss {t.item():.2f}", flush=True)
        if step == 1:
            print(f"[rank {rank}] saving checkpoint shard asynchronously", flush=True)
            ckpt.save_async({"step": step, "w": t}, f"ckpt-rank{rank}.pt", hung_disk=rank == 2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
