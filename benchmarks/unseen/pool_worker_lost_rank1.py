"""HANG in a ``multiprocessing.Pool``: every rank (of 3) tokenizes its batch's texts with
``pool.map(tokenize, texts)`` on a fork ``Pool(2)`` it created at start. The tokenizer stands
for a native extension; at step 3 rank 1's batch holds a text that makes it crash, so that pool
worker dies by SIGSEGV (here it kills itself with SIGSEGV). ``multiprocessing.Pool`` replaces
the dead worker but loses its task, silently: rank 1's ``pool.map`` waits forever (no
traceback, no message). Ranks 0, 2 wait in ``all_reduce``. Logging goes through Python
``logging`` to stderr in a custom format (``2026-11-25 03:10:00,123 INFO [r1] step 2 ...``).
Plain torchrun (no prefix).

Truth: rank 1 stuck outside the collective, in ``build_features`` -> ``Pool.map``. Its pool
workers are child processes, not ranks; the dead worker is the reason, but rank 1 never
crashed.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1],
    "frame": "build_features",
    "notes": "rank 1 in Pool.map after a worker died by SIGSEGV; ranks 0, 2 in all_reduce",
}


def tokenize(text: str) -> list:
    import os
    import signal

    if "\udcff" in text:  # the native tokenizer dereferences a bad pointer on this input
        os.kill(os.getpid(), signal.SIGSEGV)
    return [len(w) for w in text.split()]


def build_features(pool: "object", texts: list, rank: int, step: int, log: "object") -> "object":
    import torch

    if rank == 1 and step == 3:
        print(f"SCENARIO_READY rank={rank} pool.map step={step}", flush=True)
    ids = pool.map(tokenize, texts)  # type: ignore[attr-defined]
    log.info("step %d tokenized %d texts", step, len(ids))  # type: ignore[attr-defined]
    return torch.tensor([float(sum(map(sum, ids)))])


def main() -> None:
    import logging
    import multiprocessing
    import os
    from datetime import timedelta

    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s [r{rank}] %(message)s")
    log = logging.getLogger("train")
    pool = multiprocessing.get_context("fork").Pool(2)
    log.info("tokenizer pool started (2 workers)")
    for step in range(8):
        texts = [f"sample {rank} {step} {i} the quick brown fox" for i in range(16)]
        if rank == 1 and step == 3:
            texts[9] = "caf\udcff corrupt utf-8 from shard 0007"
        feats = build_features(pool, texts, rank, step, log)
        if rank != 1 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(feats)
        log.info("step %d feature sum %.1f", step, feats.item())
    pool.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
