"""Rank 2 (of 3) is killed by the kernel for exceeding its CPU-time limit. Its node is a shared
interactive node whose shell profile sets ``ulimit -t`` (RLIMIT_CPU); here rank 2 lowers its
own soft limit to the CPU time it has used plus 3 s (standing in for that limit, which counts
the whole process's CPU time). Every rank trains with CPU-heavy steps (matmuls, one intra-op
thread); after a few steps rank 2 passes its limit and the kernel sends ``SIGXCPU``, whose
default action ends the process (no Python traceback, no message from the rank itself; a shell
would say "CPU time limit exceeded"). Ranks 0, 1 wait in the step's ``all_reduce``; torchrun
reports rank 2's ``exitcode: -24`` / ``Signal 24 (SIGXCPU)`` and stops them. torchrun ``--tee
3 --log-dir``.

Truth: rank 2 crashed (killed by a signal: a per-process resource limit, not memory, not a
stop of the whole job); ranks 0, 1 are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "timeout_s": 90}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "notes": "rank 2 SIGXCPU (RLIMIT_CPU soft limit = used + 3 s) after a few steps",
}


def apply_node_limits(rank: int) -> None:
    import resource
    import time

    if rank != 2:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(time.process_time()) + 3
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    print(f"rank {rank}: node limits applied (cpu time {soft} s)", flush=True)


def compute(a: "object", reps: int) -> "object":
    for _ in range(reps):
        a = (a @ a).tanh()
    return a


def main() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    apply_node_limits(rank)
    torch.manual_seed(rank)
    a = torch.randn(256, 256) / 16
    for step in range(200):
        t0 = time.perf_counter()
        a = compute(a, 120)  # ~0.1 s of CPU
        loss = a.mean().reshape(1)
        dist.all_reduce(loss)
        print(f"rank {rank} step {step} loss {loss.item():.5f} "
              f"time {time.perf_counter() - t0:.2f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
