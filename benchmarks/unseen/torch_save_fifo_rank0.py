"""HANG: rank 0 (of 2) saves the checkpoint with ``torch.save`` to a path that blocks on open
(a named pipe nobody reads, standing in for a hung NFS / FUSE mount), logging "Saving
checkpoint to ..." first; rank 1 waits in ``dist.barrier()`` after the save. torchrun
``--log-dir`` (per-rank files) and ``--tee 3``.

Truth: rank 0 stuck outside the collective, in ``save_checkpoint`` -> ``torch.save``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [0],
    "frame": "save_checkpoint",
    "notes": "rank 0 in torch.save -> open(fifo); rank 1 in barrier",
}


def save_checkpoint(model: "object", path: str) -> None:
    import torch

    print(f"Saving checkpoint to {path}", flush=True)
    print("SCENARIO_READY rank=0 torch.save", flush=True)
    torch.save(model.state_dict(), path)  # type: ignore[attr-defined]
    print("checkpoint saved", flush=True)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 8)
    path = os.path.abspath("ckpt_step3.pt")
    if rank == 0 and not os.path.exists(path):
        os.mkfifo(path)  # the "mount" that never answers
    for step in range(6):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"step {step} sum={t.sum().item()}", flush=True)
        if step == 3:
            if rank == 0:
                save_checkpoint(model, path)
            else:
                print(f"SCENARIO_READY rank={rank} barrier", flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
