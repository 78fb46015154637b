"""Near-miss: the master's hostname does not resolve for the first seconds, then does.

As with a Kubernetes headless service whose DNS record appears after the pods start: torchrun
prints a few c10d ``The IPv6 network addresses of (trainer-master-0, PORT) cannot be
retrieved (gai error: -2 - Name or service not known)`` warnings, then connects and the job
trains and exits 0. The runner's ``master_resolves_late`` setup gives the job a private
/etc/hosts (own mount namespace) and adds ``127.0.0.1 trainer-master-0`` 3 s after the first
warning.
"""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 2,
    "master_addr": "trainer-master-0",
    "resolve_after_s": 3,
    "timeout_s": 60,
}
SETUP = "master_resolves_late"
EXPECT = {
    "cause": None,
    "ranks": [],
    "notes": "transient gai warnings before rendezvous; the job then completes with exit 0",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    for step in range(3):
        t = torch.ones(1) * step
        dist.all_reduce(t)
        print(f"rank={rank} step={step} sum={t.item()}", flush=True)
    dist.destroy_process_group()
    print(f"rank={rank} done", flush=True)


if __name__ == "__main__":
    main()
