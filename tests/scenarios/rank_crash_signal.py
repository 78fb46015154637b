"""Rank 1 is SIGKILLed mid-training (as the kernel OOM killer would do): no traceback, no
Python error at all from it; torchrun's summary reports ``exitcode: -9`` /
``Signal 9 (SIGKILL) received by PID``. Launched with ``torchrun --log-dir ... --redirects 3``:
the workers' own output exists only in the per-rank log files, the console only has the
launcher's lines.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "redirects": True, "timeout_s": 60}
EXPECT = {
    # A SIGKILL with no traceback and no outside stop is reported as the OOM killer's likely
    # work (CRASH002, lower confidence); its summary names the signal.
    "cause": "out_of_memory",
    "ranks": [1],
    "signal": "SIGKILL",
    "notes": "exitcode -9; the other ranks die in all_reduce (Connection closed by peer)",
}


def main() -> None:
    import os
    import signal
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    activations = []
    for step in range(6):
        if rank == 1 and step == 2:
            time.sleep(1)  # let the others block in all_reduce first
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
        activations.append(torch.zeros(1024))  # "leaking" memory
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
