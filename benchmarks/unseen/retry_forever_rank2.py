"""HANG in an endless retry loop: each rank (of 3) fetches its next data shard from an object
store with a ``@retry(tries=None, delay=1)``-style helper that catches ``OSError``, logs a
warning and tries again, forever. From step 3 on rank 2's shard lives on a store endpoint that
is down (here a local port nobody listens on), so rank 2 logs ``WARNING | data.fetch | r2 |
fetch shard-00023 failed: [Errno 111] Connection refused; retrying in 1.0s (attempt N)`` once
a second and never gets to the step's ``all_reduce``, where ranks 0 and 1 wait. All logging
goes to stderr through Python ``logging`` with a custom format (no ``print`` but the harness's
ready markers). torchrun
``--tee 3``: in ``logs`` mode ranks 0, 1 time out in ``all_reduce`` and torchrun stops rank 2.

Truth: rank 2 is stuck outside the collective (alive, looping in ``fetch_shard`` ->
``time.sleep`` between failed connects); the ``Connection refused`` lines are its data store's,
not the job's rendezvous or Gloo peers, and ranks 0, 1 are only waiting for it.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [2],
    "frame": "fetch_shard",
    "notes": "rank 2 retries a refused connect every 1 s forever; ranks 0, 1 in all_reduce",
}

import logging  # noqa: E402

log = logging.getLogger("data.fetch")


def dead_endpoint() -> tuple[str, int]:
    """A local port with no listener: connects are refused at once."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "127.0.0.1", port


def fetch_shard(rank: int, step: int, endpoint: "tuple[str, int] | None") -> "object":
    import socket
    import time

    import torch

    name = f"shard-{rank}{step:04d}"
    attempt = 0
    while True:
        attempt += 1
        try:
            if endpoint is not None:
                with socket.create_connection(endpoint, timeout=2):
                    pass
            return torch.full((4,), float(step))
        except OSError as exc:
            if attempt == 1:
                print(f"SCENARIO_READY rank={rank} retrying {name}", flush=True)
            log.warning("fetch %s failed: %s; retrying in 1.0s (attempt %d)", name, exc, attempt)
            time.sleep(1.0)


def main() -> None:
    import os
    import sys
    from datetime import timedelta

    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s | %(levelname)s | %(name)s | r{rank} | %(message)s")
    train = logging.getLogger("trainer")
    down = dead_endpoint()
    for step in range(8):
        batch = fetch_shard(rank, step, down if (rank == 2 and step >= 3) else None)
        if rank != 2 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(batch)
        train.info("step %d sum %.1f", step, batch.sum().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
