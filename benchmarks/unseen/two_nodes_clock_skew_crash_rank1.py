"""Two nodes whose clocks disagree, one rank crashes. A hand-written multi-node wrapper (what
``srun`` does with one task per node) starts two torchrun agents on this machine, ``--nnodes 2
--node-rank 0`` and ``--node-rank 1``, static rendezvous, ``--nproc-per-node 2 --tee 3``, and
relays their output prefixed with the node's name (``node-1: [default0]:...``). Every rank
logs through Python ``logging`` with its own timestamp, host and rank (``2026-11-25
04:16:38,123 ERROR [node-1 rank 2] ...``). node-1's clock is 90 s behind node-0's (its NTP
daemon is down; here the ranks of node-1 stamp their records with ``time.time() - 90``, so
torchrun's own lines on node-1 are not skewed).

At step 4 rank 1 (node-0) raises ``ValueError`` in ``compute_loss`` (a label outside the
class range), logged with ``log.exception`` and re-raised. Ranks 0, 2, 3, in ``all_reduce``,
lose their peer (``Connection closed by peer`` / ``reset``), log that and fail. By the
timestamps in the lines, ranks 2 and 3 failed 90 s *before* rank 1; by the order of the
console and by causality, rank 1 failed first.

Truth: rank 1 crashed; the others' Gloo errors are symptoms, whatever their timestamps say.
"""

LAUNCH = {"launcher": "python", "nproc": 4, "timeout_s": 90, "logs_timeout_s": 120}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "rank 1 ValueError at step 4; node-1 (ranks 2, 3) log timestamps 90 s behind",
}

NODES = 2
PER_NODE = 2
SKEW_S = 90.0


def node_logger(rank: int, node: int) -> "object":
    import logging
    import sys
    import time

    fmt = logging.Formatter(f"%(asctime)s %(levelname)s [node-{node} rank {rank}] %(message)s")
    if node == 1:
        fmt.converter = lambda t: time.localtime(t - SKEW_S)  # node-1's clock is behind
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(fmt)
    log = logging.getLogger("train")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return log


def compute_loss(rank: int, step: int, labels: list) -> float:
    num_classes = 1000
    for y in labels:
        if not 0 <= y < num_classes:
            raise ValueError(f"label {y} outside [0, {num_classes}) in batch {step} of "
                             f"shard train-{rank:05d}")
    return sum(labels) / (len(labels) * num_classes)


def worker() -> None:
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    log = node_logger(rank, int(os.environ["GROUP_RANK"]))
    log.info("started, world_size %d", dist.get_world_size())
    try:
        for step in range(8):
            labels = [(rank * 31 + step * 17 + i) % 1000 for i in range(16)]
            if rank == 1 and step == 4:
                time.sleep(1.5)  # the others are in all_reduce by now
                labels[5] = 1000
            loss = torch.tensor([compute_loss(rank, step, labels)])
            dist.all_reduce(loss)
            log.info("step %d loss %.4f", step, loss.item() / 4)
    except Exception:
        log.exception("step failed")
        raise
    dist.destroy_process_group()


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
               os.path.abspath(__file__), "--worker"]
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
