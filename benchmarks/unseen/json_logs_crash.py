"""Structured logging: every rank writes JSON lines to stdout (``{"ts": ..., "level": ...,
"rank": 2, "logger": ..., "msg": ..., "exc_info": "Traceback (most recent call last):\\n ..."}``,
one object per line, as a log shipper wants them); the traceback of rank 2's failure is inside
a JSON string with escaped newlines. Rank 2 (of 3) raises ``IndexError`` at step 3; its handler
logs it as JSON and re-raises nothing (``sys.exit(1)``). The others' peer-loss errors are JSON
too. Plain torchrun (no prefix; the rank is a JSON field).

Truth: rank 2 crashed first (IndexError).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "timeout_s": 60}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [2],
    "notes": "IndexError on rank 2, only as a JSON log record",
}


def main() -> None:
    import json
    import logging
    import os
    import sys
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            doc = {"ts": self.formatTime(record), "level": record.levelname, "rank": rank,
                   "logger": record.name, "msg": record.getMessage()}
            if record.exc_info:
                doc["exc_info"] = self.formatException(record.exc_info)
            return json.dumps(doc)

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("train")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    labels = list(range(8))
    try:
        for step in range(6):
            idx = step + (10 if rank == 2 and step == 3 else 0)
            if rank == 2 and step == 3:
                time.sleep(1)
            t = torch.tensor([float(labels[idx])] * 4)
            dist.all_reduce(t)
            log.info("step %d sum %.1f", step, t.sum().item())
    except Exception:
        log.exception("training failed at step %d", step)
        sys.stdout.flush()
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
