"""HANG, named by ``monitored_barrier``: after loading the pretrained weights every rank (of 4)
syncs with ``dist.monitored_barrier(timeout=...)`` so that a rank that does not arrive is named.
Rank 2's node has a hung network mount: its ``load_pretrained`` -> ``read_shard`` never returns
(``time.sleep`` stands in for the blocked read). Ranks 1, 3 reach the barrier and wait for rank
0's answer; rank 0 waits for everyone and, at the timeout, raises ``RuntimeError: [Rank 0]:
Rank 2 failed to pass monitoredBarrier in 10000 ms`` (ranks 1, 3 then report ``Rank 1
successfully reached monitoredBarrier, but received errors ... Please check rank 0 logs for
faulty rank``). torchrun ``--log-dir`` (no tee: the per-rank files and the console).

Truth: rank 2 stuck outside the collective (``load_pretrained`` -> ``read_shard``); rank 0
raised first, but its error names rank 2, the rank that never arrived.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "log_dir": True, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [2],
    "frame": "load_pretrained",
    "notes": "rank 2 in read_shard (sleep); 0, 1, 3 in monitored_barrier; rank 0 names rank 2",
}


def read_shard(rank: int, name: str) -> bytes:
    import time

    if rank == 2:  # the mount on rank 2's node stopped answering
        print(f"SCENARIO_READY rank={rank} read_shard", flush=True)
        time.sleep(3600)
    return bytes(16)


def load_pretrained(rank: int) -> None:
    for i in range(4):
        name = f"/mnt/models/encoder/shard-{i:05d}-of-00004.bin"
        print(f"rank {rank}: reading {name}", flush=True)
        read_shard(rank, name)
    print(f"rank {rank}: pretrained weights loaded", flush=True)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    load_pretrained(rank)
    print(f"SCENARIO_READY rank={rank} monitored_barrier", flush=True)
    dist.monitored_barrier(timeout=timedelta(seconds=timeout))
    for step in range(4):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
