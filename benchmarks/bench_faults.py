"""The fault-injection matrix: real multi-node jobs, one fault each, judged verdict by verdict.

Every cell (fault x position x mode x topology) builds its nodes (network namespaces on a
private bridge, tests/faults/harness.py), runs tests/faults/train.py under one torchrun agent
per node with a c10d rendezvous, injects the fault, gathers the evidence of its mode, runs
``ddp-autopsy analyze`` and records: cause right, culprit right, seconds from the fault to the
verdict, and the verdict's words. Results accumulate in tests/faults/results.json (a cell run
again replaces its old result) and docs/faults.md is rewritten from them, every cell of the
full matrix listed: a cell that is wrong says so, a cell not run yet says "not run".

    python benchmarks/bench_faults.py                                  # the full matrix (hours)
    python benchmarks/bench_faults.py --topology 2x2 --mode logs       # a slice
    python benchmarks/bench_faults.py --fault sigstop --position node2 --topology 2x2
    python benchmarks/bench_faults.py --report-only                    # rewrite docs/faults.md
    python benchmarks/bench_faults.py --rejudge --topology 2x2         # kept evidence, new code

Needs root, ip, unshare and iptables (apt-get install -y iproute2 iptables).
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from faults.harness import (  # noqa: E402
    EXPECTED,
    MODES,
    POSITIONS,
    TOPOLOGIES,
    CellResult,
    applicable,
    can_run,
    leftovers,
    rejudge,
    run_cell,
)

RESULTS = ROOT / "tests" / "faults" / "results.json"
DOC = ROOT / "docs" / "faults.md"
FAULTS = tuple(EXPECTED)
FR_NOTE = (
    "Flight Recorder works with Gloo on CPU in torch 2.13: with `TORCH_FR_BUFFER_SIZE=2000` each "
    "rank records its collectives, and a dump-on-hang thread in train.py writes "
    "`torch._C._distributed_c10d._dump_fr_trace()` to `$TORCH_FR_DUMP_TEMP_FILE<rank>` once its "
    "loop stalls for 4 s (Gloo has no dump-on-timeout of its own, and `collect`'s debug pipe is "
    "an NCCL feature). A frozen rank (SIGSTOP, GIL held) cannot run that thread: it has no dump."
)


# Why a cell stays wrong: (fault, position or None for any, mode) -> the limit of the evidence,
# in any topology where the cell is wrong (a right cell carries no note).
LIMITS: dict[tuple[str, str | None, str], str] = {
    ("link_drop", "rank0", "logs"): (
        "A link dropped between two nodes looks the same from both sides in the logs: the "
        "launcher of the node that does not host the rendezvous store loses it (and stays "
        "silent, or times out reading it) whichever side was cut, so with two nodes a cut on "
        "the master's own node names the other node, and the verdict says the side cannot be "
        "told from logs (with three nodes or more the cut node is told apart; in `live`/`fr` "
        "the node's own packet filter, kept by collect, names it)."),
}


#: A claim written in the old format (empty: no pid) counts as alive this long (no cell runs
#: longer), then as stale.
EMPTY_CLAIM_S = 900


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), or
    None when there is no such process: a pid and its start time name one process, even
    after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _claim_alive(claim: Path) -> bool:
    """Whether the process that wrote ``claim`` (``"<pid> <start time>"``) still runs."""
    try:
        text, age = claim.read_text().split(), time.time() - claim.stat().st_mtime
    except FileNotFoundError:
        return False
    if len(text) != 2 or not text[0].isdigit():
        return age < EMPTY_CLAIM_S
    return _started(int(text[0])) == text[1]


def claim_cell(claim: Path) -> bool:
    """Claim a cell's run directory for this process (``<workdir>/<cell>.running``, deleted by
    the caller when the cell is done): True when it is ours. A claim left by a process that is
    gone (a slice killed with SIGKILL) is taken over; a live one is left to its process. Claims
    are checked and taken under one lock, so two slices never take over the same claim."""
    claim.parent.mkdir(parents=True, exist_ok=True)
    mine = f"{os.getpid()} {_started(os.getpid())}\n"
    with open(claim.parent / ".claims.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if claim.exists() and _claim_alive(claim):
            return False
        tmp = claim.with_name(f".{claim.name}.{os.getpid()}")
        tmp.write_text(mine)
        os.replace(tmp, claim)  # the claim is never seen half written
        return True


def key(r: dict) -> str:
    return f"{r['fault']}|{r['position']}|{r['mode']}|{r['topology']}"


def load_results(path: Path = RESULTS) -> dict[str, dict]:
    """Cells run so far: ``path``, and for the report every ``results*.json`` beside it (a
    slice run in parallel writes its own file); the newest file wins a cell run twice."""
    files = sorted(path.parent.glob("results*.json"), key=lambda p: p.stat().st_mtime)
    out: dict[str, dict] = {}
    mine = [path] if path.exists() else []
    for file in files if path.resolve() == RESULTS else mine:
        out.update({key(r): r for r in json.loads(file.read_text())})
    return out


def save_results(results: dict[str, dict], path: Path = RESULTS) -> None:
    path.write_text(json.dumps(sorted(results.values(), key=key), indent=1) + "\n")


def _cell(r: dict | None, why: str | None) -> tuple[str, str, str, str]:
    """(cause, culprit, seconds, verdict) columns of one row."""
    if why:
        return "n/a", "n/a", "", why
    if r is None:
        return "not run", "not run", "", ""
    if r.get("error") and r.get("cause") is None:
        return "ERROR", "ERROR", "", f"harness/tool error: {r['error']}"
    cause = ("right" if r["cause_ok"] else "**WRONG**") + f" ({r['cause']})"
    if r["culprit"] is None:
        named = f"hosts {r['hosts']} ranks {r['ranks']}"
    else:
        named = f"{r['ranks']}" + (f", state {r['culprit_state']}" if r["culprit_state"] else "")
    culprit = ("right" if r["culprit_ok"] else "**WRONG**") + f" ({named})"
    words = r["summary"].replace("|", "\\|").replace("\n", " ")
    if len(words) > 220:
        words = words[:217] + "..."
    if r.get("error"):
        words += f" [harness: {r['error']}]"
    why = LIMITS.get((r["fault"], r["position"], r["mode"])) \
        or LIMITS.get((r["fault"], None, r["mode"]))
    if why and not (r["cause_ok"] and r["culprit_ok"]):
        words += f" [why wrong: {why}]"
    return cause, culprit, "" if r["seconds"] is None else f"{r['seconds']}", words


def write_doc(results: dict[str, dict]) -> dict[str, int]:
    lines = [
        "# Fault-injection matrix",
        "",
        "Generated by `python benchmarks/bench_faults.py` (do not edit by hand). Real multi-node "
        "jobs on one machine: each node is a network namespace on a private bridge with its own "
        "host name (UTS namespace), one torchrun agent per node, c10d rendezvous, Gloo on CPU "
        "(`tests/faults/harness.py`). One training script, `tests/faults/train.py`, takes the "
        "fault from `FAULT` / `FAULT_RANK` / `FAULT_STEP` (step 3).",
        "",
        "**Modes.** `live`: while the job hangs, `ddp-autopsy collect` runs on every node inside "
        "that node's namespaces, then `analyze` reads all bundles. `logs`: Gloo timeout 20 s; "
        "the nodes' console logs (torchrun `--tee 3`) once the launchers gave up, or, when a "
        "launcher never gives up, as they are once no log grew for 10 s (read before the "
        "harness stops the job, so its SIGTERMs are not in them). `fr`: `live` with Flight "
        "Recorder. "
        + FR_NOTE,
        "",
        "**Positions.** rank0, rank1, middle (world/2), last, node2 (first rank of the second "
        "node); ranks are contiguous per node (checked in every run from the ranks' own "
        "`FAULT_START ... host=` lines). Node-level faults (link drop, blocked port, "
        "unresolvable host, WORLD_SIZE) strike the node of that rank. **Culprit right** means the "
        "verdict names exactly that rank (node-level faults: only ranks or hosts of that node; "
        "blocked port: the cause suffices); a frozen rank (SIGSTOP, GIL) whose state is "
        "`crashed` is wrong. **Seconds**: from the fault (the culprit's `FAULT_INJECT` line, the "
        "link drop, or the launch for start-up faults) to the verdict; a cell judged again "
        "after a fix (`--rejudge`: its kept evidence, today's analysis) keeps its run's seconds.",
        "",
        "**Limits of the harness.** In `logs` mode a launcher that never gives up is read once "
        "its logs, not empty, grew no more for 10 s (at least 25 s after the fault; 60 s after "
        "the launch for start-up faults, whose TCPStore connect is tried twice with a 20 s "
        "timeout): a failure whose own timeout is longer still may show no failure line yet, "
        "so a silent verdict there can be the harness's doing. Faults made with DETAIL end "
        "the job with an error on every rank, so they have no `live`/`fr` cells. Ranks are "
        "checked to be on the node the position names; a mismatch is a harness note in the "
        "cell.",
        "",
        "**Known limits of the analysis** (cells marked WRONG for these reasons; each such "
        "cell carries its reason as a note). " + " ".join(LIMITS.values()),
        "",
        "## What counts as the right cause",
        "",
        "| fault | injected as | right causes |",
        "|---|---|---|",
    ]
    how = {
        "exception": "`raise RuntimeError` in the forward pass",
        "exit": "`os._exit(1)`",
        "sigkill": "`os.kill(os.getpid(), SIGKILL)`",
        "sigsegv": "`ctypes.string_at(0)` (a real segfault)",
        "sigstop": "SIGSTOP to itself (frozen)",
        "gil": "`ctypes.PyDLL(None).sleep(10**6)`: native code holding the GIL",
        "busy_loop": "an endless Python loop outside collectives",
        "dataloader_block": "a DataLoader worker whose `__getitem__` never returns",
        "lone_barrier": "`dist.barrier()` on the culprit only",
        "lone_barrier_detail": "the same with `TORCH_DISTRIBUTED_DEBUG=DETAIL`",
        "skip_collective": "the culprit skips the loss all_reduce once (DETAIL)",
        "wrong_shape": "the culprit all-reduces a gradient one element short (DETAIL)",
        "straggler": "`time.sleep(10**5)` before the step",
        "link_drop": "`iptables -A INPUT -i fab0 -j DROP` and OUTPUT in the node's namespace "
                     "at step 3",
        "port_blocked": "`iptables -A INPUT --dport <rdzv port> -j DROP` on node 0 before launch",
        "unresolved_host": "endpoint `node-0:port`; that node's /etc/hosts lacks node-0",
        "world_size": "the node's ranks set WORLD_SIZE to world+1 before init",
    }
    for fault in FAULTS:
        lines.append(f"| {fault} | {how[fault]} | {', '.join(EXPECTED[fault])} |")
    counts = {"cells": 0, "run": 0, "right": 0, "rank0": 0, "rank0_right": 0,
              "hard": 0, "hard_right": 0, "frozen": 0, "frozen_right": 0, "na": 0, "errors": 0}
    rows = []
    for topology, fault, position, mode in itertools.product(TOPOLOGIES, FAULTS, POSITIONS,
                                                             MODES):
        why = applicable(fault, position, mode, topology)
        r = results.get(f"{fault}|{position}|{mode}|{topology}")
        counts["cells"] += 1
        if why:
            counts["na"] += 1
        elif r is not None:
            counts["run"] += 1
            ok = bool(r["cause_ok"] and r["culprit_ok"])
            counts["right"] += ok
            counts["errors"] += bool(r.get("error"))
            if position == "rank0":
                counts["rank0"] += 1
                counts["rank0_right"] += ok
            if fault in ("sigkill", "sigsegv", "sigstop"):
                counts["hard"] += 1
                counts["hard_right"] += ok
            if fault in ("sigstop", "gil") and mode in ("live", "fr"):
                # with stacks a stopped or GIL-held rank must be named frozen, never crashed
                counts["frozen"] += 1
                counts["frozen_right"] += r.get("culprit_state") == "frozen"
        cause, culprit, secs, words = _cell(r, why)
        rows.append(f"| {topology} | {fault} | {position} | {mode} | {cause} | {culprit} | "
                    f"{secs} | {words} |")

    def pct(a: int, b: int) -> str:
        return f"{a}/{b} ({100 * a / b:.1f} %)" if b else "0/0"

    lines += [
        "",
        "## Score",
        "",
        f"- cells in the full matrix: {counts['cells']} ({counts['na']} not applicable, "
        f"{counts['cells'] - counts['na'] - counts['run']} not run yet)",
        f"- cause and culprit right: {pct(counts['right'], counts['run'])} of the cells run",
        f"- rank-0 cells: {pct(counts['rank0_right'], counts['rank0'])}",
        f"- SIGKILL / SIGSEGV / SIGSTOP cells: {pct(counts['hard_right'], counts['hard'])}",
        f"- a stopped (SIGSTOP) or GIL-held rank named frozen in its rank state, live and fr "
        f"cells: {pct(counts['frozen_right'], counts['frozen'])} (logs mode has no stacks: "
        "the harness stops the job, the rank reads as exited or seen, never crashed)",
        f"- cells with a harness note: {counts['errors']}",
        "",
        "## Cells",
        "",
        "| topology | fault | position | mode | cause | culprit | s | verdict |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    DOC.write_text("\n".join(lines))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fault", action="append", choices=FAULTS)
    parser.add_argument("--position", action="append", choices=POSITIONS)
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--topology", action="append", choices=list(TOPOLOGIES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ddp_autopsy_faults"))
    parser.add_argument("--skip-done", action="store_true", help="keep cells already run")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--rejudge", action="store_true",
                        help="analyze the kept evidence of the selected cells again (after a fix)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where this run keeps its cells (a parallel slice: its own file, "
                        "tests/faults/results-<name>.json)")
    args = parser.parse_args(argv)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too: the running cell's nodes are torn down

    signal.signal(signal.SIGTERM, interrupted)
    results = load_results(args.results)
    done = set(load_results()) | set(results)  # --skip-done: a cell run in any slice's file
    if args.rejudge:
        for k, old in sorted(results.items()):
            fault, position, mode, topology = k.split("|")
            if (args.fault and fault not in args.fault) or (
                    args.position and position not in args.position) or (
                    args.mode and mode not in args.mode) or (
                    args.topology and topology not in args.topology):
                continue
            try:
                res = rejudge(old)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                print(f"rejudge {k}: {exc}", file=sys.stderr)
                continue
            if res is None:
                continue
            results[k] = asdict(res)
            mark = "ok " if res.right else "BAD"
            print(f"rejudged {mark} {k:45s} {res.cause} {res.ranks}", flush=True)
        save_results(results, args.results)
    elif not args.report_only:
        why = can_run()
        if why:
            print(f"bench_faults: cannot run here: {why}", file=sys.stderr)
            return 2
        cells = [c for c in itertools.product(args.fault or FAULTS, args.position or POSITIONS,
                                              args.mode or MODES, args.topology or TOPOLOGIES)
                 if applicable(*c) is None]
        for n, (fault, position, mode, topology) in enumerate(cells, 1):
            k = f"{fault}|{position}|{mode}|{topology}"
            if args.skip_done and (k in done or k in load_results()):
                continue  # also a cell another slice ran since this one started
            # a cell another slice is running now (same run directory): left to it (the claim
            # of a slice that was killed is taken over)
            claim = args.workdir / f"{fault}-{position}-{mode}-{topology}.running"
            if not claim_cell(claim):
                continue
            t0 = time.monotonic()
            try:
                res = run_cell(fault, position, mode, topology, args.workdir)
            except Exception as exc:  # a harness failure is recorded, the matrix goes on
                res = CellResult(fault, position, mode, topology,
                                 error=f"{type(exc).__name__}: {exc}")
            finally:
                claim.unlink(missing_ok=True)
            results[k] = asdict(res)
            save_results(results, args.results)
            left = leftovers(res.cluster, res.tag) if res.cluster else leftovers()
            mark = "ok " if res.right else "BAD"
            print(f"[{n}/{len(cells)}] {mark} {k:45s} {res.cause} {res.ranks} "
                  f"{time.monotonic() - t0:5.1f}s {res.error or ''}"
                  + (f" LEFTOVERS {left}" if left else ""), flush=True)
    counts = write_doc(load_results())
    print(json.dumps(counts), f"-> {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
