"""Rank 1 skips one all_reduce; Flight Recorder dumps show where, and who never joined.

Each step all-reduces the loss, and every other step also the gradient norm (for clipping).
At step 3 rank 1 decides locally that its gradient norm is not finite and skips that
all_reduce. Gloo pairs collectives by order, so from then on rank 1's loss all_reduce is
silently combined with the other ranks' gradient-norm all_reduce (same shape): rank 1 runs one
collective ahead, finishes its steps, and goes into ``validate()`` (rank-local) while ranks 0
and 2 wait in their last all_reduce. It hangs until the runner collects it.

With ``TORCH_FR_BUFFER_SIZE=2000`` Gloo records every collective in the Flight Recorder. A
dumper thread in each rank writes the trace through torch's own API,
``torch._C._distributed_c10d._dump_fr_trace()`` (pickle, with call stacks) to
``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (torch's ``prefix + rank`` naming, relative to the job's
directory) and ``_dump_fr_trace_json()`` to ``fr_json/<hostname>_rank<rank>.json``, the way a
user's dump-on-timeout hook would, while the main thread stays blocked in the collective.

From the stacks alone the diagnosis would be rank 1 stuck in ``validate`` while the others wait
in ``all_reduce``; ``collect`` also picks up the dumps (the relative prefix resolved against the
workers' directory), and with them the verdict is the skipped all_reduce itself: the first
collective whose call site differs between ranks (``tests/test_collectives.py``).
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 3,
    "hang": True,
    "env": {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "fr_dumps/nccl_trace_rank_"},
    "timeout_s": 60,
}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1],
    "frame": "validate",
    "site": "fr_skipped_allreduce.py:81",
    "fr_seq": 6,
    "fr_pending": 9,
    "notes": "rank 1 skips the grad-norm all_reduce at step 3, so its next all_reduce (#6, the "
    "loss) pairs with the others' grad norm; it runs one collective ahead and waits in "
    "validate() while ranks 0, 2 wait in all_reduce #9",
}

STEPS = 6
DUMP_AFTER_S = 1.5


def validate() -> None:
    import time

    while True:  # rank-local work that never ends (a slow eval on the full set)
        time.sleep(0.5)


def dump_flight_recorder(rank: int) -> None:
    import os
    import socket

    import torch

    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with open(f"{prefix}{rank}", "wb") as fh:
        fh.write(torch._C._distributed_c10d._dump_fr_trace())
    os.makedirs("fr_json", exist_ok=True)
    with open(f"fr_json/{socket.gethostname()}_rank{rank}.json", "wb") as fh:
        fh.write(torch._C._distributed_c10d._dump_fr_trace_json())
    print(f"SCENARIO_READY rank={rank}", flush=True)


def main() -> None:
    import threading
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    threading.Timer(DUMP_AFTER_S, dump_flight_recorder, args=(rank,)).start()
    for step in range(STEPS):
        loss = torch.tensor([1.0 + rank])
        dist.all_reduce(loss)
        if step % 2 == 1:
            grad_norm = torch.tensor([0.5])
            if rank == 1 and step == 3:
                continue  # the bug: "non-finite grad norm, skip this step" decided locally
            dist.all_reduce(grad_norm)
    validate()


if __name__ == "__main__":
    main()
