"""A hung Gloo job for the collect tests: rank 1 sleeps in ``evaluate()``, the others wait in
``dist.all_reduce``. Each rank touches ``$READY_DIR/rank<R>`` when it is about to block.

Run under torchrun (RANK comes from the env) or with ``--spawn N`` (torch.multiprocessing.spawn,
no RANK env in the children). ``--dataloader-rank R`` gives rank R a live 2-worker DataLoader.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def evaluate() -> None:
    while True:
        time.sleep(0.5)


def _mark_ready(rank: int) -> None:
    print(f"READY rank={rank} pid={os.getpid()} url={os.environ.get('DATA_URL')} "
          f"MY_SECRET_KEY={os.environ.get('MY_SECRET_KEY')} token={os.environ.get('HF_TOKEN')}",
          flush=True)
    ready_dir = os.environ.get("READY_DIR")
    if ready_dir:
        # written whole, then renamed: a reader never sees the marker empty
        tmp = Path(ready_dir, f".rank{rank}.tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, Path(ready_dir, f"rank{rank}"))


def run(rank: int, world_size: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=600))
    batches = None
    if rank == args.dataloader_rank:
        data = torch.utils.data.TensorDataset(torch.arange(64.0))
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2,
                                             persistent_workers=True)
        batches = iter(loader)
        next(batches)  # workers are up and stay alive while the iterator does
    # a secret in a local of the frame that blocks: collect's stack dumps (py-spy --locals) keep
    # only torch.distributed's own call arguments, never this
    token = os.environ.get("HF_TOKEN") or args.hf_token
    _mark_ready(rank)
    if rank == 1 and token is not None:
        evaluate()
    dist.all_reduce(torch.ones(1))
    del batches


def _spawn_entry(index: int, world_size: int, args: argparse.Namespace) -> None:
    run(index, world_size, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spawn", type=int, default=0)
    parser.add_argument("--dataloader-rank", type=int, default=-1)
    parser.add_argument("--data-url", default="")
    parser.add_argument("--hf-token", default="")
    args = parser.parse_args()
    if args.spawn:
        torch.multiprocessing.spawn(_spawn_entry, args=(args.spawn, args), nprocs=args.spawn)
    else:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
