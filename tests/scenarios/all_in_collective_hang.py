"""Near-miss for "stuck outside a collective": a healthy but slow job, collected mid-run.

Every rank spends ~0.4 s per step in ``forward_backward()`` (simulated compute) and then
all-reduces; all ranks keep advancing in lockstep and keep printing step lines. A snapshot
finds the ranks in the same places (compute or the same all_reduce), none lagging.
Plain ``torchrun``: the workers' step lines reach the console as they happen.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "hang": True, "timeout_s": 40}
EXPECT = {
    "cause": None,
    "ranks": [],
    "notes": "slow but progressing: step counters keep increasing on every rank",
}


def forward_backward(step: int) -> float:
    import time

    time.sleep(0.4)  # stands in for real compute
    return 1.0 / (step + 1)


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    for step in range(10_000):
        loss = torch.tensor([forward_backward(step)])
        dist.all_reduce(loss)
        print(f"rank={rank} step={step} loss={loss.item() / 2:.4f}", flush=True)
        if step == 3:
            print(f"SCENARIO_READY rank={rank} training", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
