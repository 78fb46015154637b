"""Disk full while checkpointing: at step 2 every rank (of 3) saves its own shard with
``torch.save`` to node-local scratch (``$TMPDIR/ckpt-<port>/rank<N>/step2.pt``) and then waits for
the others in ``dist.barrier()``. Rank 1's scratch disk is full (here its shard path is a symlink to
``/dev/full``, which fails every write with ENOSPC, set up by the job at start), so
``torch.save`` fails with PyTorch's cryptic serializer errors, not the word "space":
``RuntimeError: basic_ios::clear: iostream error`` and, during its handling, ``RuntimeError:
[enforce fail at inline_container.cc:NNN] . unexpected pos 640 vs 534``. Ranks 0, 2 wait in the
barrier and lose their peer. Logging through Python ``logging`` (``[time] INFO train: ...``, no
rank in the format). Plain torchrun.

Truth: rank 1 crashed first (its ``torch.save`` failed: disk full); the others are symptoms.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "frame": "save_shard",
    "notes": "rank 1 torch.save to /dev/full: iostream error / inline_container unexpected pos",
}


def scratch_dir() -> str:
    import os

    return f"{os.environ.get('TMPDIR', '/tmp')}/ckpt-{os.environ['MASTER_PORT']}"


def save_shard(model: "object", rank: int, step: int, log: "object") -> None:
    import torch

    path = f"{scratch_dir()}/rank{rank}/step{step}.pt"
    log.info("saving shard to %s", path)  # type: ignore[attr-defined]
    torch.save({"step": step, "model": model.state_dict()}, path)  # type: ignore[attr-defined]
    log.info("saved %s", path)  # type: ignore[attr-defined]


def main() -> None:
    import logging
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO,
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("train")
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    os.makedirs(f"{scratch_dir()}/rank{rank}", exist_ok=True)
    if rank == 1:  # rank 1's node-local scratch is full: every write fails with ENOSPC
        os.symlink("/dev/full", f"{scratch_dir()}/rank1/step2.pt")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    for step in range(5):
        for p in model.parameters():
            g = torch.ones_like(p)
            dist.all_reduce(g)
            p.data.add_(g, alpha=-1e-3)
        log.info("step %d done", step)
        if step == 2:
            save_shard(model, rank, step, log)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
