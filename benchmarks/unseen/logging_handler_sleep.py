"""HANG with Python ``logging`` in a custom format (``2026-11-24 06:01:02,123 | INFO |
trainer | r2 | step 3 ...``, the rank only inside the format, no launcher prefix): rank 2 (of
4) ships its log records to a remote collector through a custom handler whose ``emit`` blocks
(the collector stopped answering; ``time.sleep`` stands in for the socket). Ranks 0, 1, 3 wait
in ``all_reduce``. Plain torchrun.

Truth: rank 2 stuck outside the collective, in ``RemoteHandler.emit``.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 4, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [2],
    "frame": "emit",
    "notes": "rank 2 in logging handler emit -> time.sleep; ranks 0, 1, 3 in all_reduce",
}

import logging  # noqa: E402


class RemoteHandler(logging.Handler):
    """Sends records to a log collector; on rank 2 the collector hangs from step 3 on."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def emit(self, record: logging.LogRecord) -> None:
        import time

        if self.rank == 2 and "step 3" in record.getMessage():
            print(f"SCENARIO_READY rank={self.rank} shipping log record", flush=True)
            while True:
                time.sleep(0.5)


def main() -> None:
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    rank = int(os.environ["RANK"])
    fmt = f"%(asctime)s | %(levelname)s | %(name)s | r{rank} | %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stdout)
    log = logging.getLogger("trainer")
    log.addHandler(RemoteHandler(rank))
    for h in logging.getLogger().handlers:
        h.flush()
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    for step in range(10):
        loss = torch.tensor([1.0 / (step + 1)])
        if rank != 2 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(loss)
        log.info("step %d loss %.4f", step + 1, loss.item())
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
