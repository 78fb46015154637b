"""HANG: every rank broadcasts the resumed optimizer state from the rank that saved it, but rank 3
reads that rank from its own (stale) config: ``src=2`` where ranks 0-2 use ``src=0``. All four
block in ``broadcast`` at the same line (ranks 1, 2 one tensor further than ranks 0, 3); only the
root each names differs, which the stacks' call arguments show (collect keeps
torch.distributed's ``src``/``dst`` locals). Gloo timeout 300 s;
collected while hung. Plain ``torchrun``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [3],
    "frame": "broadcast",
    "notes": "broadcast(src=2) on rank 3, broadcast(src=0) on ranks 0-2",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    saved_by = 2 if rank == 3 else 0
    state = {"step": torch.zeros(1), "exp_avg": torch.zeros(4096), "exp_avg_sq": torch.zeros(4096)}
    print(f"SCENARIO_READY rank={rank}", flush=True)
    for tensor in state.values():
        dist.broadcast(tensor, src=saved_by)
    print(f"rank={rank} resumed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
