"""HANG after training finished: the job never exits. Every rank (of 3) trains, destroys its
process group and logs "training finished"; rank 1, which owns the final artifact, hands the
checkpoint upload to a ``concurrent.futures.ThreadPoolExecutor`` (``upload_artifact``: a raw
HTTP PUT with ``socket.sendall``, no timeout) and returns from ``main``. The artifact store
accepted the TCP connection but never reads (here a socket that rank 1 listens on without ever
calling ``accept``), so ``sendall`` blocks once the socket buffers fill; at interpreter exit
``concurrent.futures`` joins its worker threads, so rank 1's main thread waits forever in
``threading._shutdown`` / the executor's join. Ranks 0 and 2 exit 0; torchrun waits for rank 1
with no timeout: no error, no traceback, ever. torchrun ``--tee 3 --log-dir``. In logs mode the
job is stopped from outside after 45 s (the scheduler's time limit), as it would never end.

Truth: rank 1 is stuck outside any collective (in the upload thread its exit waits for); the
SIGTERM that finally ends the job is the symptom.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60, "logs_timeout_s": 45}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "ranks": [1],
    "frame": "upload_artifact",
    "notes": "rank 1 main thread in threading._shutdown; its upload thread in socket.sendall",
}

STORE: list = []


def artifact_store() -> "tuple[object, int]":
    """A store that accepts TCP connections (backlog) but never reads them."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    return srv, srv.getsockname()[1]


def upload_artifact(port: int, payload: bytes) -> int:
    import socket

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"PUT /artifacts/run-417/final.pt HTTP/1.1\r\nHost: store\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(payload))
    sock.sendall(payload)  # the store never reads: blocks once the buffers are full
    return len(payload)


def main() -> None:
    import os
    from concurrent.futures import ThreadPoolExecutor
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    w = torch.zeros(16)
    for step in range(6):
        g = torch.full((16,), 0.1 * (rank + 1))
        dist.all_reduce(g)
        w -= 0.01 * g
        print(f"rank {rank} step {step} w0 {w[0].item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 1:
        srv, port = artifact_store()
        STORE.append(srv)  # the store stays up (a module global outlives main)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uploader")
        pool.submit(upload_artifact, port, bytes(64 * 1024 * 1024))
        print(f"rank {rank}: uploading final checkpoint to artifact store (background)",
              flush=True)
    print(f"rank {rank}: training finished", flush=True)
    print(f"SCENARIO_READY rank={rank} exiting", flush=True)


if __name__ == "__main__":
    main()
