"""MASTER_ADDR names a host that does not resolve (a typo, or a node that is gone).

torchrun's agent keeps retrying the name lookup, printing c10d warnings
``The IPv6 network addresses of (no-such-host.invalid, PORT) cannot be retrieved
(gai error: -2 - Name or service not known)`` until the store connect times out.
``--rdzv-conf timeout=3`` only shortens the default 900 s wait; the output is the same.
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 2,
    "master_addr": "no-such-host.invalid",
    "torchrun_args": ["--rdzv-conf", "timeout=3"],
    "timeout_s": 60,
}
EXPECT = {
    "cause": "unresolved_host",
    "ranks": [],
    "host": "no-such-host.invalid",
    "notes": "gai error warnings, then DistNetworkError client socket timed out; exit 1",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
