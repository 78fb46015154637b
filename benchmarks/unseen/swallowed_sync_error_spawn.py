"""HANG under ``torch.multiprocessing.spawn`` (3 ranks), after a swallowed exception: at the end
of epoch 0 every rank evaluates its slice of a tiny validation set (``indices[rank::world]``:
2 samples for 3 ranks, so rank 2's slice is empty and its ``val_loss`` is ``None``), then
averages it with a "best-effort" helper ``sync_mean``. The helper converts the value to a
tensor inside a ``try``; on rank 2 ``torch.as_tensor(None, dtype=float32)`` raises
``TypeError: must be real number, not NoneType``, which the helper logs with
``log.exception("could not sync val_loss across ranks, keeping the local value")`` (a full
traceback in the log) and returns, *skipping the all_reduce*. Rank 2 goes on to the end-of-eval
``dist.barrier()``; ranks 0 and 1 wait in ``sync_mean``'s ``all_reduce``. Gloo times out on all
three. Python ``logging`` lines with the rank in the format.

Truth: collective mismatch, rank 2 the odd one (it skipped an all_reduce and waits in a barrier
the others have not reached). ``uneven_inputs`` [2] is accepted (the trigger is rank 2's empty
validation slice). Not ``rank_crashed``: the traceback is a handled exception; rank 2 is alive
in ``barrier`` until the timeout.
"""

LAUNCH = {"launcher": "python", "ready": 3, "hang": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["uneven_inputs"],
    "ranks": [2],
    "frame": "evaluate",
    "notes": "rank 2 swallows a TypeError in sync_mean, skips all_reduce, waits in barrier; "
             "ranks 0, 1 in all_reduce",
}

WORLD_SIZE = 3
VAL_SET = [(0.5, 1.0), (1.5, 2.0)]


def get_logger(rank: int) -> "object":
    import logging

    log = logging.getLogger("train")
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s [rank{rank}] %(name)s: %(message)s")
    )
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return log


def sync_mean(name: str, value: "object", rank: int, log: "object") -> "object":
    import torch
    import torch.distributed as dist

    try:
        t = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError):
        log.exception("could not sync %s across ranks, keeping the local value", name)
        return value
    print(f"SCENARIO_READY rank={rank} all_reduce {name}", flush=True)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def evaluate(rank: int, model: "object", log: "object") -> None:
    import torch
    import torch.distributed as dist

    mine = VAL_SET[rank::WORLD_SIZE]
    log.info("evaluating %d validation samples", len(mine))
    losses = []
    with torch.no_grad():
        for x, y in mine:
            pred = model(torch.tensor([[x]]))
            losses.append(float((pred - y).pow(2).mean()))
    val_loss = sum(losses) / len(losses) if losses else None
    val_loss = sync_mean("val_loss", val_loss, rank, log)
    log.info("val_loss %s", val_loss)
    print(f"SCENARIO_READY rank={rank} barrier end of eval", flush=True)
    dist.barrier()


def worker(rank: int) -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    log = get_logger(rank)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=timeout)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for step in range(3):
            x = torch.randn(4, 1)
            loss = (model(x) - 2 * x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= WORLD_SIZE
            opt.step()
            log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
        evaluate(rank, model, log)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(worker, nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
