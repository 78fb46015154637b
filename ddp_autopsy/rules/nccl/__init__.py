"""Transport: interfaces, GPUs, shared memory and the network under NCCL and Gloo."""
