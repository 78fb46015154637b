"""The NCCL backend on a machine (here: a torch build) without CUDA: process-group creation
fails on every rank ("Distributed package doesn't have NCCL built in"); Gloo was needed."""

LAUNCH = {"launcher": "torchrun", "nproc": 2, "timeout_s": 60}
EXPECT = {
    "cause": "backend_device_mismatch",
    "ranks": [],
    "notes": "init_process_group('nccl') with CPU tensors on a CPU-only build",
}


def main() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", timeout=timedelta(seconds=20))
    t = torch.ones(2)
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
