"""A DeepSpeed-style launcher written by hand, and a truncated checkpoint shard on rank 1. The
job is started through a ``launch.py``-like parent (the file itself without ``--local_rank``)
that logs like DeepSpeed's launcher (``[2026-11-25 04:17:33,123] [INFO] [launch.py:164:main]
dist_world_size=3``), spawns one ``python -u <script> --local_rank=N`` per rank with RANK /
LOCAL_RANK / WORLD_SIZE set, polls them, and, when one exits non-zero, runs its
``sigkill_handler``: ``Killing subprocess <pid>`` for every child (SIGTERM, then SIGKILL), then
``[ERROR] [launch.py:325:sigkill_handler] [...] exits with return code = 1`` and exits with that
code. Like DeepSpeed's, that error line names the command line of the *last spawned* process
(``--local_rank=2``), not of the one that failed. The ranks log in DeepSpeed's format
(``[time] [INFO] [file.py:line:func] [Rank N] ...``).

The job resumes from a checkpoint with one optimizer-state shard per rank
(``zero_pp_rank_N_mp_rank_00_optim_states.pt`` under ``$TMPDIR/ds-ckpt-<port>/global_step400``,
written before launch; rank 1's shard is cut to half its size, as when the previous run was
killed while saving). Rank 1's ``torch.load`` raises ``RuntimeError: PytorchStreamReader failed
reading zip archive: failed finding central directory``; ranks 0, 2 wait in ``dist.barrier()``
after their load and are killed by the launcher.

Truth: rank 1 crashed (the truncated shard); the launcher's kills and its error line naming
``--local_rank=2`` are consequences.
"""

LAUNCH = {"launcher": "python", "nproc": 3, "timeout_s": 90}
EXPECT = {
    "cause": "rank_crashed",
    "ranks": [1],
    "notes": "rank 1 torch.load of a truncated zip -> RuntimeError; launcher kills 0, 2",
}

WORLD = 3


def ckpt_dir() -> str:
    import os
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"ds-ckpt-{os.environ['MASTER_PORT']}",
                        "global_step400")


def shard_path(rank: int) -> str:
    import os

    return os.path.join(ckpt_dir(), f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


def ds_logger(name: str, rank: "int | None" = None) -> "object":
    import logging
    import sys

    tag = f" [Rank {rank}]" if rank is not None else ""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(
        f"[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s]{tag} %(message)s"))
    log = logging.getLogger(name)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def load_optimizer_state(rank: int) -> dict:
    import torch

    return torch.load(shard_path(rank), weights_only=True)


def worker() -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    rank = int(os.environ["RANK"])
    log = ds_logger("DeepSpeed", rank)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    log.info("DeepSpeed info: version=0.16.4, git-hash=unknown, git-branch=unknown")
    log.info("Loading ZeRO optimizer state from %s", shard_path(rank))
    state = load_optimizer_state(rank)
    log.info("Loaded optimizer state: step %d, %d tensors", int(state["step"]),
             len(state["exp_avg"]))
    dist.barrier()
    for step in range(401, 406):
        t = torch.ones(8) * step
        dist.all_reduce(t)
        log.info("step=%d, skipped=0, lr=[3e-05], loss=%.4f", step, 1.0 / (step - 399))
    dist.destroy_process_group()


def write_checkpoint() -> None:
    import os

    import torch

    os.makedirs(ckpt_dir(), exist_ok=True)
    for rank in range(WORLD):
        state = {"step": torch.tensor(400),
                 "exp_avg": [torch.randn(256, 64) for _ in range(8)],
                 "exp_avg_sq": [torch.rand(256, 64) for _ in range(8)]}
        torch.save(state, shard_path(rank))
    size = os.path.getsize(shard_path(1))
    with open(shard_path(1), "r+b") as fh:  # the previous run was killed while saving
        fh.truncate(size // 2)


def launch() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    log = ds_logger("DeepSpeedLauncher")
    write_checkpoint()
    log.info("WORLD INFO DICT: {'localhost': [0, 1, 2]}")
    log.info("nnodes=1, num_local_procs=3, node_rank=0")
    log.info("global_rank_mapping=defaultdict(<class 'list'>, {'localhost': [0, 1, 2]})")
    log.info("dist_world_size=%d", WORLD)
    log.info("Setting CUDA_VISIBLE_DEVICES=0,1,2")
    processes = []
    cmd: list = []
    for local_rank in range(WORLD):
        env = {**os.environ, "RANK": str(local_rank), "LOCAL_RANK": str(local_rank),
               "WORLD_SIZE": str(WORLD)}
        cmd = [sys.executable, "-u", os.path.abspath(__file__), f"--local_rank={local_rank}"]
        proc = subprocess.Popen(cmd, env=env)
        log.info("process %d spawned with command: %s", proc.pid, cmd)
        processes.append(proc)
    last_return_code = None

    def sigkill_handler(signum: int, frame: object) -> None:
        for proc in processes:
            log.info("Killing subprocess %d", proc.pid)
            try:
                proc.terminate()
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
            except Exception:
                pass
        if last_return_code is not None:
            log.error("%s exits with return code = %s", cmd, last_return_code)
            sys.exit(last_return_code)
        if signum in (signal.SIGINT, signal.SIGTERM):
            sys.exit(1)

    signal.signal(signal.SIGINT, sigkill_handler)
    signal.signal(signal.SIGTERM, sigkill_handler)
    alive = list(processes)
    while alive:
        finished = []
        for proc in alive:
            if proc.poll() is None:
                continue
            if proc.returncode != 0:
                last_return_code = proc.returncode
                sigkill_handler(signal.SIGTERM, None)
            finished.append(proc)
        alive = [p for p in alive if p not in finished]
        time.sleep(1)


def main() -> None:
    import sys

    if any(a.startswith("--local_rank") for a in sys.argv[1:]):
        worker()
    else:
        launch()


if __name__ == "__main__":
    main()
