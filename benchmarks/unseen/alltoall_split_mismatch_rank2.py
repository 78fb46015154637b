"""A mixture-of-experts layer (one expert per rank, 3 ranks) dispatches tokens with
``all_to_all_single``: each rank counts how many of its tokens go to each expert, the counts
are exchanged with a first ``all_to_all_single``, and the tokens are sent with those splits.
Rank 2's node runs with a stale config (``moe_uniform_dispatch=True``, an old capacity-padding
mode): it *declares* its real counts but *sends* a uniform split (6 tokens as 2/2/2). For the
first steps the routing happens to be uniform and nothing shows; at step 3 rank 2 routes
1/3/2, so rank 0 receives 2 tokens from rank 2 where it expected 1, and Gloo aborts rank 0
(``terminate called after throwing an instance of 'gloo::EnforceNotMet'`` ... ``Received data
size doesn't match expected size. Is there a distributed collective mismatch in your code?``,
SIGABRT); ranks 1, 2 lose their peer. Every rank logs its declared send and receive splits per
step (``send=[1, 3, 2] recv=[...]``), as MoE code often does. torchrun ``--tee 3``.

Truth: collective mismatch, rank 2 (its sends disagree with the splits it declared; rank 0 is
the victim that aborted, not the culprit). ``config_mismatch`` [2] is accepted too: the bug is
a setting that differs on rank 2's node.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["config_mismatch"],
    "ranks": [2],
    "op": "all_to_all_single",
    "notes": "rank 2 sends [2, 2, 2] but declared [1, 3, 2] at step 3; rank 0 aborts (SIGABRT)",
}

# tokens each rank routes to each expert, per step (rows: source rank, columns: expert)
ROUTING = {
    0: [[2, 2, 2], [2, 2, 2], [2, 2, 2]],
    1: [[3, 1, 2], [2, 2, 2], [2, 2, 2]],
    2: [[2, 2, 2], [1, 3, 2], [2, 2, 2]],
    3: [[2, 3, 1], [1, 1, 4], [1, 3, 2]],
}


def dispatch(tokens: "object", counts: list[int], rank: int, step: int,
             uniform: bool) -> "object":
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    send_counts = torch.tensor(counts, dtype=torch.int64)
    recv_counts = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, send_counts)
    recv_splits = recv_counts.tolist()
    send_splits = list(counts)
    if uniform:  # stale capacity-padding mode: same number of tokens to every expert
        send_splits = [len(tokens) // world] * world  # type: ignore[arg-type]
    print(f"rank {rank} step {step} moe dispatch send={counts} recv={recv_splits}", flush=True)
    out = torch.empty(sum(recv_splits), tokens.shape[1])  # type: ignore[attr-defined]
    dist.all_to_all_single(out, tokens, recv_splits, send_splits)
    return out


def main() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    uniform = rank == 2  # moe_uniform_dispatch=True in rank 2's node config
    print(f"rank {rank}: moe experts=3 moe_uniform_dispatch={uniform}", flush=True)
    for step in range(6):
        counts = ROUTING.get(step, ROUTING[1])[rank]
        tokens = torch.randn(sum(counts), 4)
        out = dispatch(tokens, counts, rank, step, uniform)
        loss = out.pow(2).mean().reshape(1)
        dist.all_reduce(loss)
        print(f"rank {rank} step {step} loss {loss.item() / 3:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
