"""Rank 2 (of 3) is killed with SIGTERM by another process: a "health monitor" thread on rank
0 (it exchanged PIDs with ``all_gather_object`` at start) decides rank 2 is unhealthy and
``os.kill``s it at step 3. Rank 2 dies without a traceback (exit by signal 15); torchrun's
summary says ``exitcode: -15`` / ``Signal 15 (SIGTERM) received by PID``; ranks 0, 1 lose
their peer. The launcher itself got no signal. torchrun ``--tee 3``.

Truth: rank 2 died first (killed by a signal from outside its own code): ``rank_crashed`` [2].
``job_terminated`` is accepted only if it names rank 2: the signal did come from outside, but it
struck one rank, not the job.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "also": ["job_terminated"],
    "ranks": [2],
    "notes": "SIGTERM to rank 2's pid from rank 0; exitcode -15",
}


def main() -> None:
    import os
    import signal
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    pids: list = [None] * world
    dist.all_gather_object(pids, os.getpid())
    for step in range(8):
        if rank == 0 and step == 3:
            print(f"health monitor: rank 2 (pid {pids[2]}) unresponsive, terminating", flush=True)
            os.kill(pids[2], signal.SIGTERM)
        if rank == 2 and step == 3:
            time.sleep(2)  # it dies here
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
