"""HANG (slowly): rank 2 (of 3) gets slower every step. Its node degrades (a failing fan:
the CPU throttles harder and harder; here its ``augment_batch`` busy-loops for 0.05 s * 2**step
while the others' takes 0.05 s), so its compute time doubles each step. Every rank logs its
per-step timings the way trainers do (``step 5 compute 1.600s allreduce 0.000s``): ranks 0, 1
show short compute and an all-reduce wait that grows with rank 2's compute. Nothing fails until
one of rank 2's steps outlasts the Gloo timeout: then ranks 0, 1 time out in ``all_reduce``
while rank 2 is still computing. torchrun ``--tee 3 --log-dir``.

Truth: a straggler, rank 2 (the steadily slowing rank; the others only wait for it).
``rank_stuck_outside_collective`` [2] is accepted too: at the moment the job died (and in any
live snapshot) rank 2 is busy in ``augment_batch`` while the others wait in ``all_reduce``,
and naming rank 2 in its compute points to the fix.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "straggler",
    "also": ["rank_stuck_outside_collective"],
    "ranks": [2],
    "frame": "augment_batch",
    "notes": "rank 2 compute 0.05*2**step s (12.8 s at step 8 > 10 s Gloo timeout); 0, 1 wait",
}


def augment_batch(rank: int, step: int) -> float:
    import time

    seconds = 0.05 * (2 ** step) if rank == 2 else 0.05
    if rank == 2 and step == 8:
        print(f"SCENARIO_READY rank={rank} augment step={step}", flush=True)
    end = time.perf_counter() + seconds
    acc = 0.0
    while time.perf_counter() < end:  # CPU-bound: throttled on rank 2's node
        for i in range(2000):
            acc += (i % 7) * 0.5
    return acc


def main() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(20):
        t0 = time.perf_counter()
        augment_batch(rank, step)
        t1 = time.perf_counter()
        loss = torch.tensor([1.0 / (step + 1)])
        if rank != 2 and step == 8:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(loss)
        t2 = time.perf_counter()
        print(f"rank {rank} step {step} compute {t1 - t0:.3f}s allreduce {t2 - t1:.3f}s "
              f"loss {loss.item() / 3:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
