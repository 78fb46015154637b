"""One process per rank (srun-like, ``rank<N>.log`` each), 3 ranks. After
``init_process_group``, rank 0 preprocesses the corpus (builds the token cache) and then
touches ``cache/.prepared``; ranks 1, 2 do not use a barrier (preprocessing can take longer
than the collective timeout) but poll ``while not os.path.exists(flag)`` with their own
deadline. Rank 0 fails while preprocessing: ``vocab.json`` is truncated (a partial copy; the
job writes it so, standing in for an interrupted rsync), ``json.JSONDecodeError:
Unterminated string ...``, traceback in ``rank0.log``, exit 1. Nobody tells ranks 1, 2: they
keep polling until their deadline (``0.8 * UNSEEN_TIMEOUT``) and then raise their own
``TimeoutError: cache/.prepared did not appear after 8s (is rank 0 still preprocessing?)``,
seconds after rank 0 died. No Gloo error anywhere (no collective was pending).

Truth: rank 0 crashed first (JSONDecodeError); the later TimeoutErrors of ranks 1, 2 are
symptoms of it.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "timeout_s": 90}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [0],
    "notes": "rank 0 JSONDecodeError in preprocess; ranks 1, 2 TimeoutError in their flag-file "
             "wait ~8 s later",
}


def preprocess(rank: int) -> None:
    import json
    import os

    os.makedirs("cache", exist_ok=True)
    print(f"rank {rank}: preprocessing corpus -> cache/", flush=True)
    with open("vocab.json") as fh:
        vocab = json.load(fh)
    with open("cache/tokens.bin", "wb") as fh:
        fh.write(bytes(len(vocab)))
    open("cache/.prepared", "w").close()


def wait_for_file(path: str, deadline_s: float, rank: int) -> None:
    import os
    import time

    print(f"rank {rank}: waiting for {path} (up to {deadline_s:.0f}s)", flush=True)
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > deadline_s:
            raise TimeoutError(
                f"{path} did not appear after {deadline_s:.0f}s (is rank 0 still preprocessing?)"
            )
        time.sleep(0.2)


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    if rank == 0:  # a partial copy of the vocabulary (interrupted transfer)
        with open("vocab.json", "w") as fh:
            fh.write('{"<pad>": 0, "<unk>": 1, "the": 2, "quick": 3, "bro')
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    print(f"rank {rank}: joined the process group (world {dist.get_world_size()})", flush=True)
    if rank == 0:
        preprocess(rank)
    else:
        wait_for_file("cache/.prepared", 0.8 * timeout, rank)
    for step in range(4):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
