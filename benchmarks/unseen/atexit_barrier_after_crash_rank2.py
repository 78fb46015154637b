"""HANG after a crash: ``setup_distributed()`` registers an ``atexit`` handler,
``cleanup_distributed()``, that calls ``dist.barrier()`` ("let everyone finish writing") and
then ``destroy_process_group()``. At step 3 rank 2 (of 3) raises ``ValueError: could not
broadcast input array from shape (3,224,224) into shape (3,256,256)`` in its ``collate`` (one
image of the wrong size). Python prints the traceback, then runs the atexit handler before the
process can exit: rank 2 blocks in that ``barrier`` while ranks 0, 1 wait in step 3's
``all_reduce``. The process stays alive until the Gloo timeout; torchrun learns nothing until
then, and its summary may name whichever rank exits first. torchrun ``--tee 3 --log-dir``.

Truth: rank 2 crashed (ValueError); the hang is its atexit barrier. The others' timeouts (and
their own atexit barriers failing) are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "frame": "collate",
    "notes": "rank 2 ValueError traceback printed, then alive in atexit cleanup_distributed -> "
             "barrier; ranks 0, 1 in all_reduce step 3",
}


def cleanup_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        rank = dist.get_rank()
        print(f"rank {rank}: cleanup: waiting for all ranks before teardown", flush=True)
        print(f"SCENARIO_READY rank={rank} atexit barrier", flush=True)
        dist.barrier()
        dist.destroy_process_group()


def setup_distributed() -> int:
    import atexit
    import os
    from datetime import timedelta

    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    atexit.register(cleanup_distributed)
    return dist.get_rank()


def collate(rank: int, step: int) -> "object":
    import numpy as np

    batch = np.zeros((4, 3, 256, 256), dtype=np.float32)
    for i in range(4):
        size = 224 if (rank == 2 and step == 3 and i == 1) else 256
        batch[i] = np.ones((3, size, size), dtype=np.float32)
    return batch


def main() -> None:
    import torch
    import torch.distributed as dist

    rank = setup_distributed()
    for step in range(8):
        batch = torch.from_numpy(collate(rank, step))
        loss = batch.mean().reshape(1)
        if rank != 2 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(loss)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
