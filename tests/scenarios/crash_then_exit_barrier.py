"""HANG: rank 1 raises ``KeyError`` in its batch lookup at step 3 (uncaught: its traceback is
printed); the script had registered an ``atexit`` hook that waits in ``dist.barrier()`` "so every
rank's metrics file is complete", so rank 1 does not exit: its interpreter runs the hook and
blocks there, while ranks 0 and 2 wait in step 3's ``all_reduce``. Collected while it hangs: rank
1's stack is the hook alone (no ``<module>`` frame: the program is over). Launched with
``torchrun --tee 3 --log-dir``.

Truth: rank 1 crashed; the barrier in its exit path only keeps the job from dying of it.
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 3,
    "log_dir": True,
    "tee": True,
    "hang": True,
    "timeout_s": 40,
}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "exception": "KeyError",
    "stack_frame": "flush_metrics",
    "notes": "rank 1: KeyError, then atexit hook in dist.barrier; ranks 0, 2 in all_reduce",
}


def main() -> None:
    import atexit
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()

    def flush_metrics() -> None:
        print(f"SCENARIO_READY rank={rank} exit barrier", flush=True)
        dist.barrier()  # every rank's metrics written before anyone leaves

    atexit.register(flush_metrics)
    index = {step: step * 10 for step in range(10) if not (rank == 1 and step == 3)}
    for step in range(10):
        if step == 3 and rank != 1:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        t = torch.full((4,), float(index[step]))
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
