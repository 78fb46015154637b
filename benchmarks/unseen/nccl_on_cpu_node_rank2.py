"""One process per rank (srun-like, ``rank<N>.log`` each), 3 ranks. The training script picks
its backend with ``"nccl" if "CUDA_VISIBLE_DEVICES" in os.environ else "gloo"``. Rank 2 landed
on a CPU node whose prolog exports an *empty* ``CUDA_VISIBLE_DEVICES`` (here rank 2 sets it
itself, standing in for that prolog), so rank 2 asks for NCCL, ranks 0, 1 for Gloo. Each rank
logs its choice with Python ``logging`` (``[2026-...][rank2][INFO] backend=nccl ...``). Rank 2
reaches the store and then fails in ``init_process_group``: ``RuntimeError: Distributed package
doesn't have NCCL built in`` (a traceback, exit 1). Ranks 0, 1 wait in the Gloo mesh set-up
for rank 2's address and fail once the 10 s timeout passes (``DistStoreError: wait timeout
... keys: /default_pg/0//cpu//0/2`` or a Gloo connect error).

Truth: rank 2 crashed at start-up (its init raised); the others are symptoms. Accepted too:
``config_mismatch`` [2] (the ranks disagree on the backend: that is why it raised) and
``backend_device_mismatch`` [2] (an NCCL backend asked for on a node without GPUs / without NCCL).
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": "rank_crashed",
    "also": ["config_mismatch", "backend_device_mismatch"],
    "ranks": [2],
    "frame": "setup_distributed",
    "notes": "rank 2 init_process_group('nccl') on a CPU-only torch: no NCCL built in",
}


def pick_backend() -> str:
    import os

    return "nccl" if "CUDA_VISIBLE_DEVICES" in os.environ else "gloo"


def setup_distributed(rank: int, log: "object") -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    backend = pick_backend()
    log.info("backend=%s world_size=%s master=%s:%s", backend, os.environ["WORLD_SIZE"],
             os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    log.info("process group ready")


def main() -> None:
    import logging
    import os
    import sys

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    if rank == 2:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU node's prolog
    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format=f"[%(asctime)s][rank{rank}][%(levelname)s] %(message)s")
    log = logging.getLogger("train")
    setup_distributed(rank, log)
    for step in range(4):
        t = torch.ones(4)
        dist.all_reduce(t)
        log.info("step %d sum %.1f", step, t.sum().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
