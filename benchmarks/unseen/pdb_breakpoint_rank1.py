"""HANG at a forgotten ``breakpoint()``: while chasing a loss spike someone added ``if loss >
SPIKE: breakpoint()`` to ``train_step`` and forgot it. One process per rank (srun-like,
``rank<N>.log`` each), 3 ranks, launched from a terminal multiplexer session nobody watches:
stdin is a terminal nobody types into (here rank 1 puts a pipe whose write end it keeps open on
fd 0, standing in for that terminal; only rank 1 needs it, the others never read stdin). At
step 3 rank 1's loss spikes; pdb prints where it stopped (``> .../pdb_breakpoint_rank1.py(NN)
train_step()``, ``-> return loss``) and its ``(Pdb) `` prompt, and waits for a command
forever. Ranks 0 and 2 wait in the step's ``all_reduce`` (in ``logs`` mode they time out; rank 1
stays in pdb until it is stopped).

Truth: rank 1 is stuck outside the collective, in the debugger (``train_step`` -> pdb reading
stdin); the others only wait for it.
"""

LAUNCH = {"launcher": "procs", "world_size": 3, "hang": True, "timeout_s": 60,
          "logs_timeout_s": 45}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1],
    "frame": "train_step",
    "notes": "rank 1 at a (Pdb) prompt (breakpoint() in train_step), ranks 0, 2 in all_reduce",
}

SPIKE = 5.0


def train_step(rank: int, step: int, x: "object") -> "object":
    loss = (x * x).mean()
    if rank == 1 and step == 3:
        loss = loss + 50.0  # the spike being chased
        print(f"SCENARIO_READY rank={rank} breakpoint", flush=True)
    if loss.item() > SPIKE:
        breakpoint()  # (left in by mistake)
    return loss


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if rank == 1:  # stand-in for a terminal nobody types into
        r, w = os.pipe()
        os.dup2(r, 0)
        os.environ["_KEEP_STDIN_WRITER"] = str(w)
    os.environ.pop("PYTHONBREAKPOINT", None)
    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    torch.manual_seed(rank)
    for step in range(6):
        x = torch.rand(16)
        loss = train_step(rank, step, x)
        if rank != 1 and step == 3:
            print(f"SCENARIO_READY rank={rank} all_reduce step={step}", flush=True)
        dist.all_reduce(loss)
        print(f"rank {rank} step {step} loss {loss.item() / 3:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
