"""HANG in a DataLoader worker: every rank's dataset keeps decoded samples in memory behind a
``threading.Lock``; when a shard is not in the node's local cache, ``load_shard`` takes the
lock and starts a background thread that decodes the shard and releases the lock when done
(readers wait in ``__getitem__``). At epoch 1 rank 1's shard is not cached (its node's cache
was wiped), so the lock is held when the epoch's ``DataLoader`` (``num_workers=2``, fork)
starts its workers: each worker inherits a copy of the lock *held*, by a thread that does not
exist in the child, and blocks forever in ``__getitem__``. Rank 1's main process waits in
the DataLoader for a batch that never comes; ranks 0 and 2 wait in the step's ``all_reduce``
until the Gloo timeout. torchrun ``--tee 3 --log-dir``.

Truth: rank 1 is stuck outside the collective (main process in ``DataLoader.__next__``, its
workers in ``ShardDataset.__getitem__`` -> ``Lock.acquire``). Not a collective mismatch (rank
1 never calls a collective) and not a crash (rank 1 and its workers are alive until stopped).
"""

import threading

import torch
from torch.utils.data import DataLoader, Dataset

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1],
    "frame": "__getitem__",
    "notes": "rank 1's DataLoader workers forked with the cache lock held; 0, 2 in all_reduce",
}

SAMPLES = 16


class ShardDataset(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.lock = threading.Lock()
        self.samples: dict[int, torch.Tensor] = {}

    def load_shard(self, epoch: int) -> None:
        cached = not (self.rank == 1 and epoch == 1)  # rank 1's node lost its local cache
        if cached:
            with self.lock:
                self.samples = {i: torch.full((8,), float(i + epoch)) for i in range(SAMPLES)}
            print(f"rank {self.rank}: epoch {epoch}: shard loaded from local cache", flush=True)
            return
        print(f"rank {self.rank}: epoch {epoch}: shard not in local cache, decoding in the "
              "background", flush=True)
        self.lock.acquire()  # readers wait in __getitem__ until the shard is decoded
        threading.Thread(target=self._decode, args=(epoch,), daemon=True).start()

    def _decode(self, epoch: int) -> None:
        import time

        try:
            samples = {}
            for i in range(SAMPLES):
                time.sleep(0.25)  # decompress + decode one sample
                samples[i] = torch.full((8,), float(i + epoch))
            self.samples = samples
        finally:
            self.lock.release()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        with self.lock:
            return self.samples[i]


def main() -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = ShardDataset(rank)
    for epoch in range(3):
        dataset.load_shard(epoch)
        loader = DataLoader(dataset, batch_size=4, num_workers=2)
        if epoch == 1 and rank == 1:
            print(f"SCENARIO_READY rank={rank} epoch={epoch} waiting for the first batch",
                  flush=True)
        for step, batch in enumerate(loader):
            loss = model(batch).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            if epoch == 1 and step == 0:
                print(f"SCENARIO_READY rank={rank} epoch={epoch} step={step} all_reduce",
                      flush=True)
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
            print(f"rank {rank} epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
