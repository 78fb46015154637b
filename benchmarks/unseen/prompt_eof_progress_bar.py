"""Rank 0 (of 3) draws a tqdm-style progress bar on stderr (``\\r`` redraws, no newline) while
the last rank, 2, finds an existing output directory and asks ``input("... overwrite? [y/N]
")``: under a batch scheduler stdin is ``/dev/null``, so it raises ``EOFError: EOF when reading
a line``. Its traceback lands in the console glued after rank 0's bar. Ranks 0, 1 lose their
peer. torchrun (no prefix).

Truth: rank 2 crashed first (EOFError).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "notes": "EOFError from input() on rank 2; progress bar on rank 0",
}


def bar(step: int, total: int) -> str:
    done = int(20 * step / total)
    return f"\rTrain: {100 * step // total:3d}%|{'█' * done}{' ' * (20 - done)}| {step}/{total} "


def main() -> None:
    import os
    import sys
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    total = 10
    for step in range(total):
        if rank == 2 and step == 4:
            time.sleep(1)
            answer = input("output_dir 'runs/exp1' exists, overwrite? [y/N] ")
            if answer.lower() != "y":
                sys.exit(0)
        t = torch.ones(4)
        dist.all_reduce(t)
        if rank == 0:
            sys.stderr.write(bar(step + 1, total))
            sys.stderr.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
