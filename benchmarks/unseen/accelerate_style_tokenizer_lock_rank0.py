"""HANG inside a third-party tokenizer, under an accelerate-style launcher. The job is started
the way ``accelerate launch`` starts one: a wrapper process (this file without ``--worker``)
prints accelerate's "values were not passed ... defaults used" notice and runs torch's elastic
agent *in-process* (``torch.distributed.launcher.api.elastic_launch``, 3 workers, static
rendezvous), so the launcher's command line is the wrapper's, not ``torchrun``'s; the workers'
output goes straight to the console.

Every rank tokenizes its batches with ``fasttok``, a vendored tokenizer package (written at
start to ``$TMPDIR/unseen-vendor-<port>/lib/python3.11/site-packages/fasttok``, so its frames
look like any installed library's). ``fasttok`` keeps a module-level ``threading.Lock`` around
its vocabulary; its ``warm_cache()`` runs in a background thread that takes the lock and then
waits for a cache-fill event. On rank 0, which called ``Tokenizer.load(..., warm=True)`` (only
rank 0 writes the shared cache), that event is never set, so at step 3, when rank 0 meets an
out-of-cache word, ``Tokenizer.encode`` blocks forever on the lock held by the warm-up thread.
Ranks 1, 2 wait in ``all_reduce``; in logs mode Gloo times them out and the agent stops rank 0.

Truth: rank 0 is stuck outside the collective, in ``fasttok``'s ``encode`` (the lock its own
warm-up thread holds), called from ``tokenize_batch``.
"""

LAUNCH = {"launcher": "python", "nproc": 3, "hang": True, "timeout_s": 90,
          "logs_timeout_s": 120}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [0],
    "frame": "tokenize_batch",
    "notes": "rank 0 in fasttok/core.py encode -> lock.acquire; ranks 1, 2 in all_reduce",
}

WORLD = 3

FASTTOK = '''\
"""fasttok: a small BPE-ish tokenizer with a shared vocabulary cache."""
import threading

_VOCAB_LOCK = threading.Lock()
_cache_filled = threading.Event()


class Tokenizer:
    def __init__(self, vocab):
        self.vocab = dict(vocab)

    @classmethod
    def load(cls, name, warm=False):
        tok = cls({w: i for i, w in enumerate(["<pad>", "<unk>", "the", "a", "of", "to"])})
        if warm:
            threading.Thread(target=tok.warm_cache, name="fasttok-warm", daemon=True).start()
        return tok

    def warm_cache(self):
        with _VOCAB_LOCK:
            _cache_filled.wait()  # filled by the cache writer, which never reports back
            self.vocab.update({})

    def _lookup_slow(self, word):
        with _VOCAB_LOCK:
            return self.vocab.setdefault(word, len(self.vocab))

    def encode(self, text):
        ids = []
        for word in text.split():
            idx = self.vocab.get(word)
            if idx is None:
                idx = self._lookup_slow(word)
            ids.append(idx)
        return ids
'''


def vendor_dir() -> str:
    import os
    import tempfile

    root = os.path.join(tempfile.gettempdir(), f"unseen-vendor-{os.environ['MASTER_PORT']}",
                        "lib", "python3.11", "site-packages")
    os.makedirs(os.path.join(root, "fasttok"), exist_ok=True)
    path = os.path.join(root, "fasttok", "__init__.py")
    if not os.path.exists(path):
        tmp = path + f".{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(FASTTOK)
        os.replace(tmp, path)
    return root


def tokenize_batch(tok: "object", rank: int, step: int) -> list:
    texts = ["the of a to the", "a to the of", "of the a", "to a the of a"]
    if step == 3:
        texts.append("the hyperparameterization of a")  # an out-of-cache word
        if rank == 0:
            print(f"SCENARIO_READY rank={rank} tokenize step={step}", flush=True)
    return [tok.encode(t) for t in texts]


def worker() -> None:
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    sys.path.insert(0, vendor_dir())
    import fasttok

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    tok = fasttok.Tokenizer.load("tok-32k", warm=(rank == 0))
    print(f"rank {rank}: tokenizer loaded ({len(tok.vocab)} entries)", flush=True)
    for step in range(8):
        ids = tokenize_batch(tok, rank, step)
        n = torch.tensor([float(sum(len(x) for x in ids))])
        if step == 3 and rank != 0:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(n)
        print(f"rank {rank} step {step} tokens {int(n.item())}", flush=True)
    dist.destroy_process_group()


def launch() -> None:
    import os
    import sys
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    vendor_dir()
    print("The following values were not passed to `accelerate launch` and had defaults used "
          "instead:\n\t`--num_machines` was set to a value of `1`\n\t`--mixed_precision` was "
          "set to a value of `'no'`\n\t`--dynamo_backend` was set to a value of `'no'`\n"
          "To avoid this warning pass in values for each of the problematic parameters or run "
          "`accelerate config`.", flush=True)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=WORLD, run_id=str(uuid.uuid4()),
        rdzv_backend="static", rdzv_endpoint=f"{os.environ['MASTER_ADDR']}:"
        f"{os.environ['MASTER_PORT']}", rdzv_configs={"rank": 0}, max_restarts=0,
        monitor_interval=0.5,
    )
    elastic_launch(config, sys.executable)("-u", os.path.abspath(__file__), "--worker")


def main() -> None:
    import sys

    if "--worker" in sys.argv:
        worker()
    else:
        launch()


if __name__ == "__main__":
    main()
