"""Benchmark ``ddp-autopsy analyze`` end to end against ``rg -c`` (run on demand, not in CI).

    python benchmarks/bench_analyze.py slurm --ranks 64 --size 2G       # generate, then measure
    python benchmarks/bench_analyze.py nccl-files --ranks 4096 --size 4G
    python benchmarks/bench_analyze.py --path benchmarks/out/slurm-64   # measure existing data

For each input it reports, warm cache (every file is read once first):

- ``analyze``: wall time of ``python -m ddp_autopsy analyze PATH --format json`` in a fresh
  process (the best of ``--runs``), its throughput and peak RSS;
- ``rg -c``: ripgrep counting the same candidate lines (the analyzer's needles and context
  regexes) over the same files, and the ratio of the two times;
- whether the verdict names the culprit rank written by ``generate.py`` (``expected.json``).

Results are printed as a Markdown table row and appended to ``benchmarks/out/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from generate import LAYOUTS, OUT, generate, parse_size  # benchmarks/ is the script's dir


def warm(path: Path) -> int:
    """Read every file once (page cache); return the total size."""
    total = 0
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    for f in files:
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                total += len(chunk)
    return total


def timed(cmd: list[str]) -> tuple[float, int, bytes]:
    """Wall seconds, peak RSS (bytes) and stdout of one run of ``cmd``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, _, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024, out


def patterns_file() -> Path:
    """The analyzer's pre-filter as ripgrep patterns: the same lines are candidates."""
    from ddp_autopsy.analyzer import events
    from ddp_autopsy.analyzer import patterns as P

    lines = [events.rust_escape(n) for n in (*events.NEEDLES, *events.ELASTIC_FIELDS)]
    lines += list(P.EXTRA_FILTERS)
    path = OUT / "rg-patterns.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def bench(path: Path, runs: int) -> dict:
    size = warm(path)
    expected_path = path / "expected.json" if path.is_dir() else None
    expected = json.loads(expected_path.read_text()) if expected_path and expected_path.exists() \
        else {}
    analyze = [sys.executable, "-m", "ddp_autopsy", "analyze", str(path), "--format", "json"]
    best = min((timed(analyze) for _ in range(runs)), key=lambda r: r[0])
    seconds, rss, out = best
    verdict = (json.loads(out) if out else {}).get("verdict") or {}
    row = {
        "input": str(path.resolve().relative_to(OUT) if path.resolve().is_relative_to(OUT)
                     else path),
        "bytes": size, "seconds": round(seconds, 2),
        "mb_per_s": round(size / seconds / 1e6), "peak_rss_mb": round(rss / 1e6),
        "verdict": verdict.get("cause"), "verdict_ranks": verdict.get("ranks"),
        "culprit_found": "culprit_rank" not in expected
        or verdict.get("ranks") == [expected["culprit_rank"]],
    }
    rg = shutil.which("rg")
    if rg:
        cmd = [rg, "-c", "-a", "--no-ignore", "--hidden", "-f", str(patterns_file()), str(path)]
        rg_s = min(timed(cmd)[0] for _ in range(runs))
        row.update(rg_seconds=round(rg_s, 2), ratio_to_rg=round(seconds / rg_s, 2))
    return row


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layout", nargs="?", choices=sorted(LAYOUTS))
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"))
    ap.add_argument("--path", type=Path, help="measure this input instead of generating one")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.path is None and args.layout is None:
        ap.error("give a layout to generate, or --path")
    path = args.path or generate(args.layout, args.ranks, args.size)
    row = bench(path, args.runs)
    row["machine"] = machine()
    with (OUT / "results.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"machine: {row['machine']}")
    print("| input | size | analyze | throughput | peak RSS | rg -c | ratio | culprit |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {row['input']} | {row['bytes'] / 1e9:.2f} GB | {row['seconds']} s | "
          f"{row['mb_per_s']} MB/s | {row['peak_rss_mb']} MB | {row.get('rg_seconds', '-')} s | "
          f"{row.get('ratio_to_rg', '-')}x | {'yes' if row['culprit_found'] else 'NO'} |")


if __name__ == "__main__":
    main()
