"""NEAR-MISS, healthy: a job whose own lines are full of failure words: metrics named
``val_error`` and ``failed_samples``, a "retrying after error" note from its own data reader
(handled, no traceback), a ``RuntimeWarning: overflow encountered in exp`` from numpy-style
code via ``warnings.warn``, and rank 2 printing ``Timed out waiting for the eval cache, computing
it locally`` (its own message). Exit 0 everywhere. torchrun ``--tee 3``.

Truth: nothing failed (``None``).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": None,
    "ranks": None,
    "notes": "failure words in the job's own healthy lines; exit 0",
}


def main() -> None:
    import os
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    if rank == 1:
        warnings.warn("overflow encountered in exp", RuntimeWarning, stacklevel=1)
    for step in range(5):
        if rank == 0 and step == 1:
            print("reader: shard 7 read failed (errno 5), retrying after error in 0.1 s",
                  flush=True)
        if rank == 2 and step == 2:
            print("Timed out waiting for the eval cache, computing it locally", flush=True)
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} loss 0.{9 - step} val_error 0.{5 - step} "
              f"failed_samples {step % 2}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
