"""A two-node job on one machine where node-1 runs a stale copy of the launch script: a
hand-written multi-node wrapper (what ``srun`` does with one task per node) starts two torchrun
agents, ``--nnodes 2 --node-rank 0`` and ``--node-rank 1``, static rendezvous,
``--nproc-per-node 2 --tee 3``, and relays their output prefixed with the node's name
(``node-1: ...``). node-1's command line still names the training script at its old path
(``../ddp-train-v1/train.py``, removed when the repository was reorganised), so both of its
workers, global ranks 2 and 3, die at once with ``python: can't open file ...: [Errno 2] No such
file or directory`` (exit code 2) and node-1's agent reports them failed (``ChildFailedError``,
exit 1). Ranks 0, 1 (node-0) wait in ``init_process_group`` for the two ranks that never join;
15 s after node-1's task failed the wrapper stops the remaining task, as ``srun``'s
``--kill-on-bad-exit`` does (``srun: error: node-1: task 1: Exited with exit code 1``, then
SIGTERM to node-0's agent, which shuts its workers down).

Truth: ranks 2 and 3 crashed (exit code 2 before any line of the job ran); ``missing_ranks``
[2, 3] is accepted too: they are the ranks that never joined the group.
"""

LAUNCH = {"launcher": "python", "nproc": 4, "timeout_s": 90, "logs_timeout_s": 120}
EXPECT = {
    "cause": "rank_crashed",
    "also": ["missing_ranks"],
    "ranks": [2, 3],
    "notes": "node-1 workers (ranks 2, 3): can't open file, exit 2; ranks 0, 1 time out in init",
}

NODES = 2
PER_NODE = 2


def worker() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    print(f"local_rank {os.environ['LOCAL_RANK']}: init_process_group (world "
          f"{os.environ['WORLD_SIZE']})", flush=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    for step in range(5):
        t = torch.ones(8) * (step + 1)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} loss {t.mean().item() / 4:.3f}", flush=True)
    dist.destroy_process_group()


def script(node: int) -> str:
    import os

    here = os.path.abspath(__file__)
    if node == 0:
        return here
    # node-1's launch line was not updated when the repository was reorganised
    return os.path.join(os.path.dirname(here), "..", "ddp-train-v1", "train.py")


def relay(proc: "object", name: str) -> None:
    import sys

    for raw in iter(proc.stdout.readline, b""):
        sys.stdout.write(f"{name}: {raw.decode(errors='replace')}")
        sys.stdout.flush()


def main() -> None:
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    if "--worker" in sys.argv:
        worker()
        return
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    agents = []
    for node in range(NODES):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES),
               "--node-rank", str(node), "--nproc-per-node", str(PER_NODE),
               "--master-addr", addr, "--master-port", port, "--tee", "3",
               script(node), "--worker"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the agent's --tee output is a pipe
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        threading.Thread(target=relay, args=(proc, f"node-{node}"), daemon=True).start()
        agents.append(proc)

    def forward(signum: int, frame: object) -> None:
        for p in agents:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    failed_at = None
    while any(p.poll() is None for p in agents):
        for node, p in enumerate(agents):
            if p.poll() not in (None, 0) and failed_at is None:
                print(f"srun: error: node-{node}: task {node}: Exited with exit code "
                      f"{p.returncode}", flush=True)
                failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > 15:
            print("srun: Job step aborted: terminating remaining tasks", flush=True)
            forward(signal.SIGTERM, None)
            failed_at = float("inf")
        time.sleep(0.2)
    time.sleep(0.5)
    sys.exit(max(p.returncode for p in agents))


if __name__ == "__main__":
    main()
