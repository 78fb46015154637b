"""Benchmark ``ddp-autopsy analyze`` end to end against ``rg -c`` (run on demand, not in CI).

    python benchmarks/bench_analyze.py slurm --ranks 64 --size 2G       # generate, then measure
    python benchmarks/bench_analyze.py nccl-files --ranks 4096 --size 4G
    python benchmarks/bench_analyze.py --path benchmarks/out/slurm-64   # measure existing data
    python benchmarks/bench_analyze.py --per-rank                       # issue #18's layouts
    # issue #18's measurement in one command: the per-rank layouts and the one large file,
    # today's code against a commit's, inputs generated once under --out and reused after:
    python benchmarks/bench_analyze.py --per-rank --single --out /tmp/bench \
        --baseline-commit 9406a5e --runs 3

``--per-rank`` generates the one-file-per-rank layouts at 0.8 MB per rank (torchrun
``--log-dir`` trees at 256 and 1024 ranks, an NCCL_DEBUG_FILE per process at 4096: 4.3 GB in
all) and measures each; ``--per-rank --mb-per-rank 0.05 --runs 1`` is a quick check. ``--single``
adds one srun ``--label`` file of 1 GB (64 ranks). An input already generated under ``--out``
with the same layout, ranks and size is reused (``--regenerate``: made anew).

For each input it reports, warm cache (every file is read once first), the best of ``--runs``
alternating runs of each tool, wall and CPU time (user + sys: other work on a shared machine
inflates it far less than wall time):

- ``analyze``: ``python -m ddp_autopsy analyze PATH --format json`` in a fresh process, its
  throughput and peak RSS;
- ``rg -c``: ripgrep counting the same candidate lines (the analyzer's needles and context
  regexes, ``benchmarks/out/rg-patterns.txt``) over the same files, and the ratio of the times;
- ``rg -c`` with six literals: reading and scanning alone, the floor of any tool that must
  look at every byte, and the ratio to it;
- whether the verdict names the culprit rank written by ``generate.py`` (``expected.json``).

Results are printed as Markdown table rows and appended to ``benchmarks/out/results.jsonl``.
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
from dataclasses import dataclass
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


#: Reading and scanning alone: six literals, so ripgrep's SIMD search runs at memory speed.
FLOOR_LITERALS = ("Error", "failed", "Exception", "Timeout", "Watchdog", "Traceback")


@dataclass
class Run:
    seconds: float  # wall
    cpu: float  # user + sys
    rss: int  # peak, bytes
    out: bytes


#: The environment of the runs: with PYTHONDONTWRITEBYTECODE set, every module edited since its
#: ``.pyc`` was written would be compiled again at each start (as a user's install is not).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str]) -> Run:
    """Wall and CPU seconds, peak RSS and stdout of one run of ``cmd`` (``PYTHONPATH=DIR``
    before it: a run of another checkout's code)."""
    env, cwd = ENV, None
    if cmd[0].startswith("PYTHONPATH="):  # run in that directory: -m imports from the cwd first
        cwd = cmd[0].split("=", 1)[1]
        env, cmd = {**ENV, "PYTHONPATH": cwd}, cmd[1:]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            cwd=cwd)
    out = proc.stdout.read() if proc.stdout else b""
    _, _, usage = os.wait4(proc.pid, 0)
    return Run(time.perf_counter() - t0, usage.ru_utime + usage.ru_stime,
               usage.ru_maxrss * 1024, out)


def best_of(cmds: dict[str, list[str]], runs: int) -> dict[str, Run]:
    """Each command's fastest run (wall), the commands alternating: load on a shared machine
    falls on all of them alike. CPU time is the least of the runs too."""
    done: dict[str, list[Run]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            done[name].append(timed(cmd))
    return {name: Run(min(r.seconds for r in rs), min(r.cpu for r in rs),
                      min(r.rss for r in rs), min(rs, key=lambda r: r.seconds).out)
            for name, rs in done.items()}


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


def bench(path: Path, runs: int, baseline: Path | None = None) -> dict:
    load_before = os.getloadavg()[0]  # others' work; the runs themselves add about 2
    size = warm(path)
    expected_path = path / "expected.json" if path.is_dir() else None
    expected = json.loads(expected_path.read_text()) if expected_path and expected_path.exists() \
        else {}
    analyze = [sys.executable, "-m", "ddp_autopsy", "analyze", str(path.resolve()),
               "--format", "json"]
    cmds = {"analyze": analyze}
    if baseline is not None:  # the same command on another checkout's code, in the same run
        cmds["baseline"] = [f"PYTHONPATH={baseline.resolve()}", *analyze]
        timed(cmds["baseline"])  # its .pyc files, untimed
    rg = shutil.which("rg")
    if rg:
        base = [rg, "-c", "-a", "--no-ignore", "--hidden"]
        cmds["rg"] = [*base, "-f", str(patterns_file()), str(path)]
        cmds["floor"] = [*base, *(x for lit in FLOOR_LITERALS for x in ("-e", lit)), str(path)]
    timed(cmds["analyze"])  # writes the .pyc files, untimed
    got = best_of(cmds, runs)
    ours = got["analyze"]
    verdict = (json.loads(ours.out) if ours.out else {}).get("verdict") or {}
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    row = {
        "input": str(path.resolve().relative_to(OUT) if path.resolve().is_relative_to(OUT)
                     else path),
        "files": len(files), "bytes": size, "seconds": round(ours.seconds, 2),
        "cpu_seconds": round(ours.cpu, 2), "mb_per_s": round(size / ours.seconds / 1e6),
        "peak_rss_mb": round(ours.rss / 1e6),
        "verdict": verdict.get("cause"), "verdict_ranks": verdict.get("ranks"),
        "culprit_found": "culprit_rank" not in expected
        or verdict.get("ranks") == [expected["culprit_rank"]],
        "runs": runs, "load_average": round(load_before, 1),
        "load_average_after": round(os.getloadavg()[0], 1),
    }
    if "baseline" in got:
        base = got["baseline"]
        base_verdict = (json.loads(base.out) if base.out else {}).get("verdict") or {}
        row |= {"baseline_seconds": round(base.seconds, 2),
                "baseline_cpu_seconds": round(base.cpu, 2),
                "baseline_peak_rss_mb": round(base.rss / 1e6),
                "baseline_same_verdict": base_verdict.get("cause") == verdict.get("cause")
                and base_verdict.get("ranks") == verdict.get("ranks")}
    for name in ("rg", "floor", "baseline"):
        if name in got:
            row[f"{name}_seconds"] = round(got[name].seconds, 2)
            row[f"{name}_cpu_seconds"] = round(got[name].cpu, 2)
            row[f"ratio_to_{name}"] = round(ours.seconds / got[name].seconds, 2)
    return row


#: Issue #18's one-file-per-rank layouts: (layout, ranks, directory under --out).
PER_RANK = (("logdir", 256, "logdir-256"), ("logdir", 1024, "logdir-1024"),
            ("nccl-files", 4096, "nccl-4096"))
#: The large single file beside them: (layout, ranks, directory, size).
SINGLE = ("slurm", 64, "slurm-64", 1 << 30)


def generated(layout: str, ranks: int, size: int, out: Path, again: bool = False) -> Path:
    """``out``, generated unless it holds this layout, ranks and size already (within 10 %)."""
    meta = out / "expected.json"
    if not again and meta.exists():
        known = json.loads(meta.read_text())
        if known.get("layout") == layout and known.get("ranks") == ranks \
                and abs(known.get("bytes", 0) - size) <= 0.1 * size:
            return out
    return generate(layout, ranks, size, out=out)


def baseline_tree(commit: str) -> Path:
    """The package as it was at ``commit`` (``git archive``), in a temporary directory."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=f"ddp-autopsy-{commit[:12]}-"))
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root
HEADER = ("| input | files | size | analyze (wall / CPU) | peak RSS | baseline (wall / CPU / RSS) "
          "| rg -c same patterns (wall / CPU) | ratio (wall; CPU) | rg -c six literals | ratio "
          "| culprit | load |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def table_row(row: dict) -> str:
    def pair(name: str) -> str:
        return f"{row[name + '_seconds']} s / {row[name + '_cpu_seconds']} s" \
            if name + "_seconds" in row else "-"
    base = f"{pair('baseline')} / {row['baseline_peak_rss_mb']} MB" \
        if "baseline_seconds" in row else "-"
    cpu_ratio = f"; {row['cpu_seconds'] / row['rg_cpu_seconds']:.2f}x" \
        if row.get("rg_cpu_seconds") else ""
    return (f"| {row['input']} | {row['files']} | {row['bytes'] / 1e9:.2f} GB | "
            f"{row['seconds']} s / {row['cpu_seconds']} s | {row['peak_rss_mb']} MB | {base} | "
            f"{pair('rg')} | {row.get('ratio_to_rg', '-')}x{cpu_ratio} | {pair('floor')} | "
            f"{row.get('ratio_to_floor', '-')}x | {'yes' if row['culprit_found'] else 'NO'} | "
            f"{row['load_average']}-{row['load_average_after']} |")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layout", nargs="?", choices=sorted(LAYOUTS))
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"))
    ap.add_argument("--path", type=Path, action="append",
                    help="measure this input instead of generating one (repeatable)")
    ap.add_argument("--per-rank", action="store_true",
                    help="generate and measure issue #18's one-file-per-rank layouts")
    ap.add_argument("--mb-per-rank", type=float, default=0.8)
    ap.add_argument("--out", type=Path, default=OUT, help="where inputs are generated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="also time another checkout's code (e.g. a `git worktree` of the "
                         "commit before a change) in the same run, alternating")
    ap.add_argument("--baseline-commit", metavar="REV",
                    help="--baseline with the code of this commit (git archive)")
    ap.add_argument("--single", action="store_true",
                    help="with --per-rank: also the one large srun --label file (1 GB)")
    ap.add_argument("--regenerate", action="store_true",
                    help="generate --per-rank / --single inputs even when --out holds them")
    args = ap.parse_args(argv)
    if args.baseline_commit:
        args.baseline = baseline_tree(args.baseline_commit)
    if args.per_rank:
        inputs = [generated(layout, ranks, int(ranks * args.mb_per_rank * 1e6),
                            args.out / name, args.regenerate) for layout, ranks, name in PER_RANK]
        if args.single:
            layout, ranks, name, size = SINGLE
            inputs.append(generated(layout, ranks, size, args.out / name, args.regenerate))
    elif args.path:
        inputs = args.path
    elif args.layout is not None:
        inputs = [generate(args.layout, args.ranks, args.size,
                           out=args.out / f"{args.layout}-{args.ranks}")]
    else:
        ap.error("give a layout to generate, --per-rank, or --path")
    print(f"machine: {machine()}" + (f"; baseline: {args.baseline}" if args.baseline else ""))
    print(HEADER)
    rows = []
    for path in inputs:
        row = bench(path, args.runs, args.baseline)
        row["machine"] = machine()
        OUT.mkdir(parents=True, exist_ok=True)
        with (OUT / "results.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(table_row(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
