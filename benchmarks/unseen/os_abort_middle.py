"""Rank 1 (of 3) calls ``os.abort()`` (a C extension's ``abort()`` after a failed internal check;
it prints its own message first), dying with SIGABRT and no Python traceback; torchrun's
summary says ``exitcode: -6`` / ``Signal 6 (SIGABRT)``. The others lose their peer.
torchrun ``--log-dir --redirects 3`` (worker output only in the per-rank files).

Truth: rank 1 crashed (SIGABRT) first.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "redirects": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "os.abort() on rank 1: exitcode -6, no traceback",
}


def main() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(6):
        if rank == 1 and step == 3:
            time.sleep(1)
            print("tokenizer_ext: internal check failed: vocab offset < 0", flush=True)
            os.abort()
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
