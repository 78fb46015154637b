"""NEAR-MISS, healthy: rank 1 (of 3) hits a corrupt sample at step 2, logs the full traceback
with ``logging.exception`` ("skipping sample"), substitutes a zero batch and goes on; rank 0
prints a ``UserWarning`` from ``warnings.warn``. All ranks finish, exit 0. torchrun ``--tee 3``.

Truth: nothing failed (``None``): a handled, logged exception in a job that exits 0 is not a
failure, and ``unclassified_failure`` would be a false alarm.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": None,
    "ranks": None,
    "notes": "a logged and handled ValueError on rank 1; exit 0 everywhere",
}


def decode(rank: int, step: int) -> list[float]:
    if rank == 1 and step == 2:
        raise ValueError(f"cannot decode sample {step * 8 + 3}: truncated JPEG")
    return [1.0] * 4


def main() -> None:
    import logging
    import os
    import sys
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("data")
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    if rank == 0:
        warnings.warn("lr scheduler step() called before optimizer step()", UserWarning,
                      stacklevel=1)
    for step in range(5):
        try:
            values = decode(rank, step)
        except ValueError:
            log.exception("rank %d: skipping sample", rank)
            values = [0.0] * 4
        t = torch.tensor(values)
        dist.all_reduce(t)
        log.info("rank %d step %d sum %.1f", rank, step, t.sum().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
