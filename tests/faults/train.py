"""One generic training job for the fault matrix; the fault is chosen by the environment.

``FAULT``        which fault (see FAULTS below; ``none`` for a healthy run)
``FAULT_RANK``   the culprit's global rank (rank-level faults)
``FAULT_NODE``   the culprit's node (``GROUP_RANK``; node-level faults injected by the script)
``FAULT_STEP``   the step at which it strikes (default 3)
``FAULT_STEPS``  steps of a healthy run (default 200)
``FAULT_TIMEOUT_S``  the process group's (Gloo) timeout (default 300)
``FAULT_FR_DUMP_S``  with Flight Recorder on (``TORCH_FR_BUFFER_SIZE``): a thread in each rank
                 dumps the trace once the main loop made no progress for this long (default 4),
                 like a user's dump-on-hang hook, to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``

Every rank prints ``FAULT_STEP rank=R step=S`` after each step and the culprit prints
``FAULT_INJECT rank=R fault=F`` just before it strikes; the harness waits on those lines.
Network faults (link drop, blocked port, unresolvable host) are made by the harness, around
the namespaces; the script then just trains.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

FAULTS = (
    "none", "exception", "exit", "sigkill", "sigsegv", "sigstop", "gil", "busy_loop",
    "dataloader_block", "lone_barrier", "lone_barrier_detail", "skip_collective", "wrong_shape",
    "straggler", "world_size",
    # made by the harness; the script trains normally
    "link_drop", "port_blocked", "unresolved_host",
)

_progress = time.monotonic()


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _fr_dumper(rank: int, after_s: float) -> None:
    """Dump the Flight Recorder once the main loop stalls (a dump-on-hang hook)."""
    import torch

    while time.monotonic() - _progress < after_s:
        time.sleep(0.2)
    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(f"{prefix}{rank}", "wb") as fh:
        fh.write(torch._C._distributed_c10d._dump_fr_trace())
    print(f"FAULT_FR_DUMPED rank={rank}", flush=True)


class Blocking:
    """A dataset whose item ``block_at`` never arrives on the culprit (a stuck worker read)."""

    def __init__(self, block_at: int, culprit: bool) -> None:
        self.block_at, self.culprit = block_at, culprit

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int):
        import torch

        if self.culprit and i >= self.block_at * 8:
            while True:  # e.g. a read from a dead network file system
                time.sleep(1)
        return torch.randn(8)


def forward(model, x, fault: str, culprit: bool, step: int, at: int):
    if culprit and step == at and fault == "exception":
        raise RuntimeError(f"injected failure in forward pass at step {step}")
    return model(x).pow(2).mean()


def inject(fault: str, rank: int, step: int) -> None:
    """Faults that strike the process itself."""
    import ctypes

    print(f"FAULT_INJECT rank={rank} fault={fault} step={step}", flush=True)
    if fault == "exit":
        os._exit(1)
    elif fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "sigsegv":
        ctypes.string_at(0)
    elif fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "gil":
        ctypes.PyDLL(None).sleep(10**6)  # PyDLL keeps the GIL held for the whole call
    elif fault == "busy_loop":
        n = 0
        while True:
            n += 1
    elif fault == "straggler":
        time.sleep(10**5)


def main() -> None:
    global _progress
    fault = os.environ.get("FAULT", "none")
    if fault not in FAULTS:
        sys.exit(f"train.py: unknown FAULT={fault!r}; known: {', '.join(FAULTS)}")
    culprit_rank, at = _env_int("FAULT_RANK", 0), _env_int("FAULT_STEP", 3)
    node = _env_int("GROUP_RANK", 0)
    if fault == "world_size" and node == _env_int("FAULT_NODE", 0):
        # this node's launcher was told another size (a copy-pasted --nnodes)
        os.environ["WORLD_SIZE"] = str(int(os.environ["WORLD_SIZE"]) + 1)
        print(f"FAULT_INJECT rank={os.environ['RANK']} fault=world_size", flush=True)
    if fault in ("skip_collective", "wrong_shape", "lone_barrier_detail"):
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=_env_int("FAULT_TIMEOUT_S", 300)))
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = rank == culprit_rank
    print(f"FAULT_START rank={rank} world={world} host={os.uname().nodename}", flush=True)
    if os.environ.get("TORCH_FR_BUFFER_SIZE") and os.environ.get("TORCH_FR_DUMP_TEMP_FILE"):
        threading.Thread(target=_fr_dumper, args=(rank, float(os.environ.get(
            "FAULT_FR_DUMP_S", 4))), daemon=True).start()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(torch.utils.data.DataLoader(
        Blocking(at, culprit and fault == "dataloader_block"), batch_size=8,
        num_workers=1 if fault == "dataloader_block" else 0))
    for step in range(_env_int("FAULT_STEPS", 200)):
        if culprit and step == at:
            if fault in ("exit", "sigkill", "sigsegv", "sigstop", "gil", "busy_loop",
                         "straggler"):
                inject(fault, rank, step)
            elif fault in ("exception", "dataloader_block", "lone_barrier",
                           "lone_barrier_detail", "skip_collective", "wrong_shape"):
                print(f"FAULT_INJECT rank={rank} fault={fault} step={step}", flush=True)
        x = next(loader)
        loss = forward(model, x, fault, culprit, step, at)
        opt.zero_grad()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if culprit and step == at and fault in ("lone_barrier", "lone_barrier_detail"):
            dist.barrier()  # "only rank R needs to wait here", but the others never come
        if culprit and step == at and fault == "wrong_shape":
            grads = grads[:-1]  # a parameter left out on this rank
        dist.all_reduce(grads)
        grads /= world
        offset = 0
        for p in model.parameters():
            p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        if not (culprit and step == at and fault == "skip_collective"):
            dist.all_reduce(loss.detach())  # the loss for logging; skipped once by the culprit
        _progress = time.monotonic()
        print(f"FAULT_STEP rank={rank} step={step} loss={loss.item():.4f}", flush=True)
        time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()
    print(f"FAULT_DONE rank={rank}", flush=True)


if __name__ == "__main__":
    main()
