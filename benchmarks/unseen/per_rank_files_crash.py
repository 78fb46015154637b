"""Every rank logs only to its own file (``logging.FileHandler("train_rank<N>.txt")``, format
``[%(asctime)s][%(levelname)s] %(message)s``, no rank in the lines): the console has nothing
but torchrun's own output. Rank 2 (of 3) fails to parse a batch at step 3, logs it with
``log.exception`` (the traceback goes to its file only) and exits with ``sys.exit(1)``.
The others lose their peer (their errors also only in their files) and torchrun's summary
names local rank 2, exitcode 1, with no traceback (no ``@record``).

Truth: rank 2 crashed first (KeyError at step 3).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "notes": "the traceback is only in train_rank2.txt; the console has torchrun's summary",
}


def main() -> None:
    import logging
    import os
    import sys
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    log = logging.getLogger("train")
    log.setLevel(logging.INFO)
    handler = logging.FileHandler(f"train_rank{rank}.txt")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s"))
    log.addHandler(handler)
    log.propagate = False
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    batches = [{"input": [1.0] * 4} for _ in range(6)]
    if rank == 2:
        batches[3] = {"inputs": [1.0] * 4}
    try:
        for step, batch in enumerate(batches):
            if rank == 2 and step == 3:
                time.sleep(1)
            t = torch.tensor(batch["input"])
            dist.all_reduce(t)
            log.info("step %d sum %.1f", step, t.sum().item())
    except Exception:
        log.exception("training failed")
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
