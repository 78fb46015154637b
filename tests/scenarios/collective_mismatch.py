"""At step 3, rank 1 calls ``broadcast`` where ranks 0 and 2 call ``all_reduce``.

With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` every collective is checked across ranks first, so
instead of hanging the job fails at once with ``Detected mismatch between collectives on
ranks``. Launched with ``torchrun --log-dir ... --tee 3``: prefixed console lines *and*
per-rank ``<run_id>/attempt_0/<local_rank>/{stdout,stderr}.log`` files.
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 3,
    "log_dir": True,
    "tee": True,
    "env": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    "timeout_s": 60,
}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1],
    "op": "BROADCAST",
    "notes": "rank 1: broadcast vs all_reduce on ranks 0, 2 at step 3",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    for step in range(6):
        t = torch.full((4,), float(rank))
        if step == 3 and rank == 1:
            dist.broadcast(t, src=0)  # the bug: this branch skipped the all_reduce
        else:
            dist.all_reduce(t)
        print(f"rank={rank} step={step} value={t[0].item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
