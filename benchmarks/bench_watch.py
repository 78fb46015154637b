"""What ``ddp-autopsy watch`` costs and how fast it catches a hang (results in docs/watch.md).

1. **Healthy job, no trigger.** ``ddp-autopsy run`` over a torchrun job of ``--ranks`` Gloo
   ranks that trains for ``--duration`` seconds with long quiet phases (every 100 steps: an
   evaluation of ``--quiet-s`` seconds on every rank, then a checkpoint where rank 0 writes
   for half that while the others wait in ``barrier``). Records whether anything triggered
   and the watcher's own CPU (itself plus its py-spy children, from ``/proc``) per second of
   watching, and its peak memory.
2. **Detection latency.** The same ranks hang in a data loader (``job.py dataloader``) under
   ``run --hang-after L --once --kill-after 0``: seconds from the hang to the declaration,
   to the complete bundle and to the printed verdict.

``python benchmarks/bench_watch.py`` (full size: 8 ranks, 300 s, 60 s quiet phases, about 7
minutes); ``--ranks 2 --duration 40 --quiet-s 8`` for a quick look. ``--faulthandler`` measures
the stack fallback instead of py-spy: the job registers faulthandler on SIGUSR1 and declares it,
and ``DDP_AUTOPSY_PYSPY`` points at a program that fails. Results go to
``benchmarks/out/watch.json`` (``watch-faulthandler.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from scenarios.runner import SCRUBBED_ENV, TAG_ENV, free_port, stop_job  # noqa: E402

JOB = ROOT / "tests" / "watch_jobs" / "job.py"
CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """utime + stime + cutime + cstime: the process and its reaped children (py-spy)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def events(out: Path) -> list[dict[str, Any]]:
    path = out / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def launch(out: Path, ranks: int, job_args: list[str], watch_args: list[str],
           env: dict[str, str]) -> subprocess.Popen[bytes]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port",
                env["MASTER_PORT"], str(JOB), *job_args]
    argv = [sys.executable, "-m", "ddp_autopsy", "run", "--out", str(out), *watch_args, "--",
            *torchrun]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(out.parent / f"{out.name}.err", "wb"))


FALLBACK = False  # --faulthandler: py-spy fails, the job's faulthandler gives the stacks


def tagged_env() -> tuple[dict[str, str], str]:
    tag = f"bench-watch-{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update({TAG_ENV: tag, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1"})
    if FALLBACK:
        env.update({"DDP_AUTOPSY_PYSPY": "/bin/false", "DDP_AUTOPSY_FAULTHANDLER": "SIGUSR1"})
    return env, tag


def job_args(*args: str) -> list[str]:
    return [*args, "--faulthandler"] if FALLBACK else list(args)


def healthy(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "healthy"
    env, tag = tagged_env()
    proc = launch(out, args.ranks, job_args("healthy", "--duration", str(args.duration),
                                            "--quiet-s", str(args.quiet_s)),
                  ["--hang-after", str(args.hang_after)], env)
    peak_rss, start, launcher = 0, None, None
    last: tuple[float, float | None] = (0.0, None)
    try:
        while proc.poll() is None:
            if start is None:
                begun = [e for e in events(out) if e["event"] == "start"]
                if begun:
                    start = (time.monotonic(), cpu_s(proc.pid) or 0.0)
                    launcher = begun[0]["launcher_pid"]
            peak_rss = max(peak_rss, rss_kib(proc.pid) or 0)
            # cutime counts reaped children: py-spy, and the launcher once the watcher reaps
            # it at the end, with all its ranks' CPU; so measure only while the launcher lives
            if launcher is None or alive(launcher):
                reading = (time.monotonic(), cpu_s(proc.pid))
                if launcher is None or alive(launcher):  # not reaped in between
                    last = reading
            time.sleep(1.0)
        evs = events(out)
    finally:
        stop_job([proc], tag)
    assert start is not None and last[1] is not None, "the watcher never started watching"
    watched_s = last[0] - start[0]
    kinds = [e["event"] for e in evs]
    return {
        "ranks": args.ranks, "duration_s": args.duration, "quiet_s": args.quiet_s,
        "hang_after": args.hang_after, "exit_code": proc.returncode,
        "triggered": "hang" in kinds or "collected" in kinds, "busy_notices": kinds.count("busy"),
        "samples": kinds.count("sample"), "fallback": kinds.count("fallback"),
        "watched_s": round(watched_s, 1),
        "watcher_cpu_s": round(last[1] - start[1], 3),
        "watcher_cpu_pct_of_core": round(100 * (last[1] - start[1]) / watched_s, 3),
        "watcher_peak_rss_mib": round(peak_rss / 1024, 1),
    }


def latency(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "latency"
    env, tag = tagged_env()
    proc = launch(out, args.ranks, job_args("dataloader"),
                  ["--hang-after", str(args.latency_hang_after), "--once", "--kill-after", "0"],
                  env)
    try:
        proc.wait(timeout=args.latency_hang_after + 600)
    finally:
        stop_job([proc], tag)
    evs = {e["event"]: e for e in events(out)}
    hang_at = max(float(x.rsplit("t=", 1)[1]) for x in (out / "console.log").read_text()
                  .splitlines() if x.startswith("HANG_START"))
    return {
        "ranks": args.ranks, "hang_after": args.latency_hang_after,
        "declared_s": round(evs["hang"]["t"] - hang_at, 1),
        "collected_s": round(evs["collected"]["t"] - hang_at, 1),
        "collect_s": round(evs["collected"]["seconds"], 1),
        "verdict_s": round(evs["verdict"]["t"] - hang_at, 1),
        "cause": evs["verdict"].get("cause"), "culprits": evs["verdict"].get("ranks"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--quiet-s", type=float, default=60.0)
    parser.add_argument("--hang-after", type=float, default=300.0)
    parser.add_argument("--latency-hang-after", type=float, default=30.0)
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "watch")
    parser.add_argument("--skip-healthy", action="store_true")
    parser.add_argument("--faulthandler", action="store_true")
    args = parser.parse_args()
    global FALLBACK
    FALLBACK = args.faulthandler
    args.work.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = args.work / stamp
    work.mkdir()
    result: dict[str, Any] = {"cores": os.cpu_count(), "load_before": os.getloadavg(),
                              "stacks": "faulthandler" if FALLBACK else "py-spy"}
    if not args.skip_healthy:
        result["healthy"] = healthy(work, args)
        print(json.dumps(result["healthy"], indent=2), flush=True)
    result["latency"] = latency(work, args)
    print(json.dumps(result["latency"], indent=2))
    result["load_after"] = os.getloadavg()
    (ROOT / "benchmarks" / "out").mkdir(exist_ok=True)
    name = "watch-faulthandler.json" if FALLBACK else "watch.json"
    (ROOT / "benchmarks" / "out" / name).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
