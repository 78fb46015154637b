"""HANG, ended by the job's own watchdog: at step 3 rank 0 (of 3) asks a schedule service for
the next learning rate (``fetch_lr_schedule``: a TCP request, ``sock.recv`` without a timeout)
and broadcasts it; ranks 1, 2 wait in that ``dist.broadcast``. The service accepted the
connection but its worker is hung, so rank 0 blocks in ``recv`` forever. The request runs
under a watchdog thread that, after ``0.6 * UNSEEN_TIMEOUT`` seconds (6 s in the ``logs`` run,
360 s in the ``live`` one), prints ``watchdog: fetch_lr_schedule made no progress for 6s,
dumping stacks and exiting``, dumps every thread's stack with ``faulthandler`` (rank 0's main
thread in ``recv`` under ``fetch_lr_schedule``) and calls ``os._exit(17)``. Ranks 1, 2 then
lose their peer. torchrun ``--tee 3 --log-dir``.

Truth: rank 0 stuck outside the collective, in ``fetch_lr_schedule`` (socket ``recv``).
``rank_crashed`` [0] is accepted: in the ``logs`` run rank 0 did exit first (code 17, its
watchdog), and naming rank 0 with its watchdog's message points to the fix.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "hang": True,
          "timeout_s": 60}
EXPECT = {
    "cause": "rank_stuck_outside_collective",
    "also": ["rank_crashed"],
    "ranks": [0],
    "frame": "fetch_lr_schedule",
    "notes": "rank 0 in socket recv (service never answers), watchdog os._exit(17); "
             "1, 2 in broadcast",
}


def start_watchdog(what: str, limit: float) -> "object":
    import faulthandler
    import os
    import sys
    import threading

    done = threading.Event()

    def watch() -> None:
        if not done.wait(limit):
            print(f"watchdog: {what} made no progress for {limit:.0f}s, dumping stacks and "
                  f"exiting", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            os._exit(17)

    threading.Thread(target=watch, name="watchdog", daemon=True).start()
    return done


def fetch_lr_schedule(service: tuple[str, int], step: int, limit: float) -> float:
    import socket

    done = start_watchdog("fetch_lr_schedule", limit)
    with socket.create_connection(service) as sock:
        sock.sendall(f"GET /lr?step={step}\n".encode())
        print("SCENARIO_READY rank=0 fetch_lr_schedule", flush=True)
        reply = sock.recv(4096)  # the service's worker is hung: never answers
    done.set()  # type: ignore[attr-defined]
    return float(reply.decode() or "0.1")


def main() -> None:
    import os
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    service = None
    if rank == 0:
        # Stands in for the schedule service: it accepts connections (the kernel completes the
        # handshake from the backlog) but nothing ever reads or answers.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        service = listener.getsockname()
    lr = torch.tensor([0.1])
    for step in range(6):
        if step == 3:
            if rank == 0:
                print(f"rank 0: fetching lr schedule from {service[0]}:{service[1]}",
                      flush=True)
                lr.fill_(fetch_lr_schedule(service, step, 0.6 * timeout))
            else:
                print(f"SCENARIO_READY rank={rank} broadcast lr", flush=True)
            dist.broadcast(lr, src=0)
        t = torch.ones(4) * lr
        dist.all_reduce(t)
        print(f"rank {rank} step {step} lr {lr.item():.3f} sum {t.sum().item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
