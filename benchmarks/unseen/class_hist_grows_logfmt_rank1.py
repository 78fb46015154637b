"""A collective whose size drifts apart after many steps, logged in logfmt. Every rank (of 3)
keeps a per-class sample count for loss re-weighting, sized by the largest label it has seen
so far (``counts = torch.zeros(max_label + 1)``, grown on demand), and all-reduces it every
step to get the global class frequencies. All shards hold labels 0-11 until rank 1's shard
shows the first sample of class 12 at step 37: its counts tensor grows to 13 elements while
ranks 0, 2 all-reduce 12. The job runs cleanly for 37 steps, then the mismatched
``all_reduce`` fails or times out. Each rank logs through Python ``logging`` in logfmt
(``ts=2026-11-25T04:16:38.123Z level=info rank=1 step=36 msg="..."``), and its top-level
handler logs the exception as one escaped logfmt line (``exc="Traceback ...\\n..."``) and exits
1 (no raw traceback on stderr). torchrun without ``--tee`` (the workers write straight to the
console, no prefix).

Truth: collective mismatch; rank 1 is the odd one (it all-reduces 13 elements, the others 12).
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "log_dir": True, "timeout_s": 120,
          "logs_timeout_s": 150}
EXPECT = {
    "cause": "collective_mismatch",
    "ranks": [1],
    "frame": "update_class_counts",
    "notes": "rank 1 counts tensor 13 elements at step 37, ranks 0, 2 have 12",
}


class Logfmt:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def format(self, record: "object") -> str:
        import datetime
        import traceback

        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        fields = [f"ts={ts.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z",
                  f"level={record.levelname.lower()}", f"rank={self.rank}",
                  f"logger={record.name}"]
        fields.append("msg=" + quote(record.getMessage()))
        if record.exc_info:
            fields.append("exc=" + quote("".join(traceback.format_exception(*record.exc_info))))
        return " ".join(fields)


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def labels_for(rank: int, step: int) -> list[int]:
    batch = [(rank * 5 + step * 7 + i) % 12 for i in range(8)]
    if rank == 1 and step == 37:
        batch[3] = 12  # the first sample of a new class, in rank 1's shard only
    return batch


def update_class_counts(counts: "object", labels: list[int]) -> "object":
    import torch
    import torch.distributed as dist

    if max(labels) + 1 > counts.numel():
        grown = torch.zeros(max(labels) + 1)
        grown[: counts.numel()] = counts
        counts = grown
    local = torch.zeros_like(counts)
    for y in labels:
        local[y] += 1
    dist.all_reduce(local)
    return counts + local


def main() -> None:
    import logging
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(Logfmt(rank))  # type: ignore[arg-type]
    log = logging.getLogger("trainer")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info("start world_size=%d", dist.get_world_size())
    try:
        counts = torch.zeros(12)
        w = torch.zeros(4)
        for step in range(60):
            labels = labels_for(rank, step)
            counts = update_class_counts(counts, labels)
            freq = counts / counts.sum()
            g = torch.full((4,), float(freq.max()))
            dist.all_reduce(g)
            w -= 0.01 * g
            if step % 4 == 0 or step > 33:
                log.info("step=%d classes=%d max_freq=%.4f w=%.4f", step, counts.numel(),
                         freq.max().item(), w[0].item())
        log.info("done")
    except Exception:
        log.exception("training failed")
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
