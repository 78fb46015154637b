"""The master port is already held by another process (e.g. a stale job on the node).

torchrun's agent cannot create its TCPStore: ``DistNetworkError ... EADDRINUSE``.
The workers never start.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "timeout_s": 60}
SETUP = "occupy_master_port"
EXPECT = {"cause": "port_in_use", "ranks": [], "notes": "launcher exits 1 before any worker"}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank={dist.get_rank()} sum={t.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
