"""Under ``torch.multiprocessing.spawn`` with ``init_method="file:///.../dist_init"``: the
file is left over from an earlier run of the job that was killed (here: a run's process group
file, kept; the new run reuses the same path). The new ranks read the stale store's keys and
their rendezvous fails or waits (``UNSEEN_TIMEOUT``). Each rank prints its init method the way
DETR / DeiT / MAE do (``| distributed init (rank 1): file:///...``); the console holds both runs,
as a requeued SLURM job's ``.out`` does.

Truth: ``stale_init_file`` (no culprit rank: the file, not a rank, is at fault).
"""

LAUNCH = {"launcher": "python", "timeout_s": 90}
EXPECT = {
    "cause": "stale_init_file",
    "ranks": None,
    "notes": "init file from an earlier, killed run of 2 ranks reused by a run of 2",
}

WORLD_SIZE = 2


def worker(rank: int, path: str, phase: str) -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    print(f"| distributed init (rank {rank}): file://{path}", flush=True)  # DETR/DeiT style
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                            world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout))
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"[{phase}] rank {rank} sum {t.sum().item()}", flush=True)
    if phase == "first run":
        open(f"{path}.up{rank}", "w").close()
        time.sleep(3600)  # the first run is killed here, as by a scheduler: the file stays
    dist.destroy_process_group()


def main() -> None:
    import os
    import signal
    import time

    import torch.multiprocessing as mp

    path = os.path.abspath("dist_init")
    ctx = mp.start_processes(worker, args=(path, "first run"), nprocs=WORLD_SIZE, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 60  # kill it once both ranks have rendezvoused and reduced
    while time.monotonic() < deadline and not all(os.path.exists(f"{path}.up{r}")
                                                  for r in range(WORLD_SIZE)):
        time.sleep(0.2)
    for p in ctx.processes:
        os.kill(p.pid, signal.SIGKILL)
    for p in ctx.processes:
        p.join()
    mp.spawn(worker, args=(path, "second run"), nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
