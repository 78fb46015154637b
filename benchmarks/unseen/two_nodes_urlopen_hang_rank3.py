"""HANG on the second "node" in an HTTP download: a two-node job on one machine. A hand-written
multi-node wrapper (what ``srun`` does with one task per node) starts two torchrun agents,
``--nnodes 2 --node-rank 0`` and ``--node-rank 1``, static rendezvous, ``--nproc-per-node 2
--tee 3``, and relays their output line by line prefixed with the node's name (``node-1:
[default1]:...``, as ``srun --label`` / pdsh do). Global ranks 0, 1 are on node-0 and 2, 3 on
node-1. At step 3 rank 3 (node-1, local rank 1) lazily fetches the tokenizer's vocabulary from
the team's model mirror with ``urllib.request.urlopen`` and no timeout (``cached_download``, a
hub-client-style helper); the mirror accepts the connection and never answers (here a socket
that rank 3 itself listens on, accepting without replying), so rank 3 blocks in
``socket.recv_into`` under ``http.client``. Ranks 0, 1, 2 wait in ``all_reduce``; in logs mode
Gloo times them out and the agents stop rank 3.

Truth: rank 3 is stuck outside the collective (in ``cached_download`` -> ``urlopen``); the
others' timeouts and the agents' SIGTERMs to rank 3 are symptoms.
"""

LAUNCH = {"launcher": "python", "nproc": 4, "hang": True, "timeout_s": 90,
          "logs_timeout_s": 120}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [3],
    "frame": "cached_download",
    "notes": "rank 3 (node-1 local 1) in urlopen -> recv_into; ranks 0, 1, 2 in all_reduce",
}

NODES = 2
PER_NODE = 2


def cached_download(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url) as resp:  # no timeout: a hung mirror hangs us
        return resp.read()


def silent_mirror() -> int:
    """A mirror that accepts connections and never answers."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held = []

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            held.append(conn)

    threading.Thread(target=serve, name="mirror", daemon=True).start()
    return srv.getsockname()[1]


def worker() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    host = f"node-{os.environ['GROUP_RANK']}"
    print(f"rank {rank} on {host} local_rank {os.environ['LOCAL_RANK']} ready", flush=True)
    port = silent_mirror() if rank == 3 else 0
    vocab = None
    for step in range(8):
        if step == 3 and vocab is None and rank == 3:
            url = f"http://127.0.0.1:{port}/models/tok-32k/resolve/main/vocab.json"
            print(f"rank {rank}: downloading {url}", flush=True)
            print(f"SCENARIO_READY rank={rank} urlopen", flush=True)
            vocab = cached_download(url)
        if step == 3 and rank != 3:
            print(f"SCENARIO_READY rank={rank} all_reduce", flush=True)
        t = torch.ones(8) * (step + 1)
        dist.all_reduce(t)
        print(f"rank {rank} step {step} loss {t.mean().item() / 4:.3f}", flush=True)
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
