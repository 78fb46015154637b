"""The user presses Ctrl-C in the terminal of a ``torch.multiprocessing.spawn`` job (3 ranks):
the terminal sends SIGINT to the whole foreground process group, so the parent and every rank
raise ``KeyboardInterrupt`` wherever they are (here a thread of the parent sends SIGINT to its
own process group at step 3, as the terminal would).

Truth: ``job_terminated`` (stopped from outside; no culprit rank).
"""

LAUNCH = {"launcher": "python", "timeout_s": 60}
EXPECT = {
    "cause": "job_terminated",
    "ranks": None,
    "notes": "SIGINT to the process group: KeyboardInterrupt on every process",
}

WORLD_SIZE = 3


def worker(rank: int) -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    for step in range(100):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
        time.sleep(0.5)
    dist.destroy_process_group()


def press_ctrl_c(after_s: float) -> None:
    import os
    import signal
    import time

    time.sleep(after_s)
    os.killpg(os.getpgid(0), signal.SIGINT)


def main() -> None:
    import threading

    import torch.multiprocessing as mp

    threading.Thread(target=press_ctrl_c, args=(12.0,), daemon=True).start()
    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
