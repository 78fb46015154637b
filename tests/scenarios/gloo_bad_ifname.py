"""GLOO_SOCKET_IFNAME names an interface this host doesn't have: creating the Gloo process
group fails on every rank ("Unable to find address for: nosuch0")."""

LAUNCH = {
    "launcher": "torchrun",
    "nproc": 2,
    "env": {"GLOO_SOCKET_IFNAME": "nosuch0"},
    "timeout_s": 60,
}
EXPECT = {
    "cause": "no_socket_interface",
    "ranks": [],
    "notes": "GLOO_SOCKET_IFNAME=nosuch0 matches no interface",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
