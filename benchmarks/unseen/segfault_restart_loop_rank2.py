"""torchrun ``--max-restarts 2`` (elastic restarts), 3 ranks: rank 2's augmentation calls a
native resize kernel (a C extension loaded with ``ctypes``) that dereferences a NULL row
pointer for an image of width 0; rank 2's shard has such an image at step 2, and the data order
is seeded, so rank 2 dies with SIGSEGV at step 2 in *every* attempt (no Python traceback, no
faulthandler: torchrun reports ``exitcode: -11`` / ``Signal 11 (SIGSEGV)``). torchrun
restarts the whole group twice (three attempts), each time stopping ranks 0 and 1 (waiting in
``all_reduce``) with SIGTERM, then gives up. torchrun ``--tee 3``. The job joins the group
through a ``PrefixStore`` named after ``TORCHELASTIC_RESTART_COUNT`` (torchrun's store outlives
a restart; without it a restarted group reads the dead attempt's Gloo addresses and fails in
init instead of reaching step 2).

Truth: rank 2 crashed (segmentation fault), the same way in each attempt. Not
``out_of_memory``: the signal is SIGSEGV, not SIGKILL. Not ``job_terminated``: the SIGTERMs to
ranks 0, 1 are torchrun's restarts, a consequence of rank 2's crash.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 120,
          "logs_timeout_s": 180, "torchrun_args": ["--max-restarts", "2"]}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "signal": "SIGSEGV",
    "notes": "rank 2 SIGSEGV at step 2 in attempts 0, 1 and 2; ranks 0, 1 in all_reduce",
}


def resize_kernel(row_ptr: int, width: int) -> bytes:
    import ctypes

    # The native kernel reads the first row after the buffer's 8-byte header through
    # row_ptr; for width 0 the caller passes NULL (the image has no pixel buffer).
    return ctypes.string_at(row_ptr + 8, max(width, 1))


def augment(rank: int, step: int) -> "object":
    import torch

    width = 0 if (rank == 2 and step == 2) else 64
    buf = torch.zeros(max(width, 1) + 8, dtype=torch.uint8)
    row_ptr = buf.data_ptr() if width else 0
    resize_kernel(row_ptr, width)
    return buf.float().mean().reshape(1)


def main() -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=float(os.environ.get("UNSEEN_TIMEOUT", "10")))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # torchrun's store outlives a restart: keep each attempt's keys apart, or the new group
    # reads the old workers' addresses.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    rank = dist.get_rank()
    print(f"rank {rank}: attempt {attempt}, world {dist.get_world_size()}", flush=True)
    for step in range(6):
        print(f"rank {rank} attempt {attempt} step {step}: augmenting batch", flush=True)
        t = augment(rank, step) + step
        dist.all_reduce(t)
        print(f"rank {rank} attempt {attempt} step {step} sum {t.item():.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
