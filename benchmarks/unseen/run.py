"""Fault injections the tool was not built around: run them, judge the verdicts, print the table.

Each ``benchmarks/unseen/<name>.py`` is a small real job (Gloo on CPU, 2-4 ranks) written in
the style of ``tests/scenarios``: ``LAUNCH`` and ``EXPECT`` literals (read with ``ast``), a
docstring that states the truth. They are launched by the scenario library's own runner
(``tests/scenarios/runner.py``), so the consoles are captured exactly as there.

Modes (every job has ``logs``; a job with ``LAUNCH["hang"]`` also has ``live``):

``logs``  the job runs with its Gloo timeout set short (``UNSEEN_TIMEOUT``, default 10 s) until
          it dies by itself; then ``ddp-autopsy analyze`` reads every file the run left
          (console, torchrun ``--log-dir``, files the job wrote in its working directory).
``live``  the job runs with a long timeout (600 s); once every rank printed ``SCENARIO_READY``
          the real collector takes a bundle of the launcher's process tree, then the job is
          stopped and ``ddp-autopsy analyze <bundle>`` reads the bundle alone.

EXPECT: ``cause`` (the truth), ``also`` (other causes accepted as right, with the reason in the
job's docstring), ``ranks`` (the culprit ranks; ``None``: not judged).

    python benchmarks/unseen/run.py                      # all, one at a time
    python benchmarks/unseen/run.py lock_last_rank       # one (or several)
    python benchmarks/unseen/run.py --mode logs NAME     # one mode
    python benchmarks/unseen/run.py --report-only        # rewrite docs/unseen-faults.md

Results accumulate in ``benchmarks/unseen/results.json`` (a run replaces its own cells) and
``docs/unseen-faults.md`` is rewritten from them. Runs are kept in ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests" / "scenarios"))

import runner  # noqa: E402  (tests/scenarios/runner.py)

RESULTS = HERE / "results.json"
DOC = ROOT / "docs" / "unseen-faults.md"
LIVE_TIMEOUT = "600"
SKIP_IN_LOGS = {"run.json", "bundle", "analysis.json"}


def jobs() -> dict[str, runner.ScenarioSpec]:
    return runner.discover(HERE)


def modes_of(spec: runner.ScenarioSpec) -> list[str]:
    return ["logs", "live"] if spec.hang else ["logs"]


def variant(spec: runner.ScenarioSpec, mode: str) -> runner.ScenarioSpec:
    """The spec as the scenario runner should launch it in ``mode``."""
    launch = dict(spec.launch)
    env = {str(k): str(v) for k, v in launch.get("env", {}).items()}
    if mode == "logs":
        launch["hang"] = False
        env["UNSEEN_TIMEOUT"] = str(launch.get("logs_gloo_timeout", 10))
        launch["timeout_s"] = launch.get("logs_timeout_s", 90)
    else:
        env["UNSEEN_TIMEOUT"] = LIVE_TIMEOUT
    env["UNSEEN_MODE"] = mode
    launch["env"] = env
    return dataclasses.replace(spec, launch=launch)


def analyze(paths: list[Path], out: Path) -> dict[str, Any]:
    """``ddp-autopsy analyze PATHS --format json``, as a user would run it."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_autopsy", "analyze", *map(str, paths), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = round(time.monotonic() - t0, 1)
    if proc.returncode not in (0, 1, 2):
        return {"error": f"analyze exited {proc.returncode}: {proc.stderr.strip()[-400:]}",
                "seconds": seconds}
    out.write_text(proc.stdout)
    doc = json.loads(proc.stdout)
    verdict = doc.get("verdict") or {}
    return {
        "cause": verdict.get("cause"),
        "ranks": verdict.get("ranks") or [],
        "rule": verdict.get("rule"),
        "summary": (verdict.get("summary") or "No root cause found.")[:300],
        "seconds": seconds,
    }


def judge(expect: dict[str, Any], got: dict[str, Any]) -> tuple[str, str]:
    right_causes = [expect.get("cause"), *expect.get("also", [])]
    cause = "right" if got.get("cause") in right_causes else "WRONG"
    want = expect.get("ranks")
    if want is None:
        culprit = "n/a"
    else:
        culprit = "right" if sorted(got.get("ranks") or []) == sorted(want) else "WRONG"
    return cause, culprit


def run_one(spec: runner.ScenarioSpec, mode: str, out: Path) -> dict[str, Any]:
    v = variant(spec, mode)
    runner.SCENARIOS[spec.name] = v  # run_scenario looks the spec up by name
    run = runner.run_scenario(spec.name, out / mode)
    cell: dict[str, Any] = {
        "job": spec.name, "mode": mode, "expect": spec.expect, "commit": _head(),
        "returncodes": run.returncodes, "run_dir": str(run.dir), "run_error": run.error,
        "duration_s": run.duration_s,
    }
    if mode == "live":
        if run.bundle is None or not Path(run.bundle).exists():
            cell.update(cause="not run", culprit="not run", got={"error": run.error})
            return cell
        inputs = [Path(run.bundle)]
    else:
        inputs = sorted(
            p for p in run.dir.iterdir()
            if p.name not in SKIP_IN_LOGS and (p.is_file() or p.is_dir())
        )
    got = analyze(inputs, run.dir / "analysis.json")
    cell["got"] = got
    if "error" in got:
        cell.update(cause="error", culprit="error")
    elif mode == "logs" and spec.expect.get("cause") and run.returncodes == [0]:
        # A racy fault (a stale init file read or not) that did not strike this time.
        cell.update(cause="no fault", culprit="no fault")
    else:
        cell["cause"], cell["culprit"] = judge(spec.expect, got)
    return cell


def rejudge(cell: dict[str, Any], spec: runner.ScenarioSpec) -> bool:
    """Analyze a kept run again with today's code (its evidence as it was, no re-run); the
    judgement before goes to the cell's history. False when the run left nothing to analyze."""
    run_dir = Path(cell.get("run_dir") or "")
    if cell.get("cause") in ("not run", "no fault", "error") or not run_dir.is_dir():
        return False
    if cell["mode"] == "live":
        inputs = [p for p in run_dir.iterdir() if (p / "manifest.json").is_file()][:1]
    else:
        inputs = sorted(p for p in run_dir.iterdir()
                        if p.name not in SKIP_IN_LOGS and (p.is_file() or p.is_dir()))
    if not inputs:
        return False
    got = analyze(inputs, run_dir / "analysis.json")
    if "error" in got:
        return False
    cell["history"] = [*cell.get("history", []), _judgement(cell)]
    cell.update(got=got, commit=f"{_head()} (rejudged)")
    cell["cause"], cell["culprit"] = judge(spec.expect, got)
    return True


def _head() -> str:
    """The checkout's commit when a cell ran (the analysis code under test changes often)."""
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "?"


def _judgement(cell: dict[str, Any]) -> str:
    got = cell.get("got", {})
    at = f" @{cell['commit']}" if cell.get("commit") else ""
    return f"{cell['cause']}/{cell['culprit']} ({got.get('cause')} {got.get('ranks')}){at}"


def _runs(cell: dict[str, Any]) -> str:
    history = [*cell.get("history", []), _judgement(cell)]
    if len(history) == 1:
        return "1"
    same = len({h.split(" ", 1)[0] for h in history}) == 1
    return f"{len(history)}, " + ("same" if same else "FLIPS: " + "; ".join(history))


def load_results() -> dict[str, dict[str, Any]]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def first_line(doc: str) -> str:
    return _one_line(doc.split("\n\n")[0])


def write_doc(results: dict[str, dict[str, Any]], specs: dict[str, runner.ScenarioSpec]) -> str:
    cells = [results[k] for k in sorted(results) if results[k]["job"] in specs]
    judged = [c for c in cells if c["cause"] in ("right", "WRONG")]
    both = [c for c in judged if c["cause"] == "right" and c["culprit"] in ("right", "n/a")]
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for c in judged:
        by_mode.setdefault(c["mode"], []).append(c)
    n_cells = sum(len(modes_of(s)) for s in specs.values())
    lines = [
        "# Unseen fault injections",
        "",
        "Generated by `python benchmarks/unseen/run.py` (do not edit by hand). Small real jobs",
        "(Gloo on CPU, 2-4 ranks, torchrun or `torch.multiprocessing.spawn`), each a fault that",
        "neither the scenario library (`tests/scenarios`) nor the fault matrix (docs/faults.md)",
        "injects. The truth of each is stated in its file (`benchmarks/unseen/<job>.py`) before",
        "the tool was run. `logs`: the job's captured output once it died by itself (Gloo timeout",
        "10 s); `live`: a bundle from `collect` while it hung, analyzed alone. **cause** is right",
        "when the verdict's cause is the truth or one of the accepted alternatives, **culprit**",
        "when the verdict names exactly the culprit ranks. **runs**: how many times the cell was",
        "run; the judgement (cause/culprit, verdict, commit of the checkout) of each run when they",
        "differ: the analysis changes between runs, so a flip is usually a rule change, not",
        "chance. The cells show the last run. `no fault`: the job exited 0 although a fault",
        "was injected (a racy fault that did not strike that run); not judged.",
        "",
        "## Score",
        "",
        f"- jobs: {len(specs)}; cells run: {len(judged)} of {n_cells}",
        f"- cause and culprit right: {len(both)}/{len(judged)}",
    ]
    for mode, cs in sorted(by_mode.items()):
        ok_cause = sum(c["cause"] == "right" for c in cs)
        ok_culprit = sum(c["culprit"] == "right" for c in cs)
        named = sum(c["culprit"] != "n/a" for c in cs)
        lines.append(
            f"- `{mode}`: cause {ok_cause}/{len(cs)}, culprit {ok_culprit}/{named}"
        )
    regressed = [c for c in cells if c.get("history") and c["cause"] in ("right", "WRONG")
                 and "WRONG" in (c["cause"], c["culprit"])
                 and c["history"][-1].startswith(("right/right", "right/n/a"))]
    if regressed:
        lines += ["", "## Right in the previous run, wrong in the last", ""]
        lines += [f"- {c['job']} ({c['mode']}): {_one_line(c['history'][-1])} -> "
                  f"{_one_line(_judgement(c))}" for c in regressed]
    lines += [
        "",
        "## Cells",
        "",
        "| job | mode | truth | cause | culprit | verdict (rule: cause [ranks]) | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        exp = c["expect"]
        truth = f"{exp.get('cause')} {exp.get('ranks')}"
        if exp.get("also"):
            truth += f" (or {', '.join(exp['also'])})"
        got = c.get("got", {})
        if "error" in got:
            said = f"error: {_one_line(got['error'])}"
        else:
            said = (f"{got.get('rule')}: {got.get('cause')} {got.get('ranks')}: "
                    f"{_one_line(got.get('summary', ''))}")
        lines.append(
            f"| {c['job']} | {c['mode']} | {truth} | {c['cause']} | {c['culprit']} | {said} "
            f"| {_one_line(_runs(c))} |"
        )
    lines += ["", "## The jobs", "", "| job | launcher | what happens |", "|---|---|---|"]
    for name, spec in sorted(specs.items()):
        lines.append(f"| {name} | {spec.launch['launcher']} | {first_line(spec.doc)} |")
    text = "\n".join(lines) + "\n"
    DOC.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--mode", choices=["logs", "live"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/unseen-runs"))
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--rejudge", action="store_true",
                        help="analyze each kept run again with today's code (no re-run)")
    args = parser.parse_args(argv)
    specs = jobs()
    unknown = [n for n in args.names if n not in specs]
    if unknown:
        parser.error(f"unknown jobs {unknown}; known: {sorted(specs)}")
    results = load_results()
    if args.rejudge:
        for key, cell in sorted(results.items()):
            if (args.names and cell["job"] not in args.names) or \
                    (args.mode and cell["mode"] != args.mode):
                continue
            if rejudge(cell, specs[cell["job"]]):
                RESULTS.write_text(json.dumps(results, indent=1, default=str) + "\n")
                print(f"{key:40s} cause={cell['cause']:7s} culprit={cell['culprit']:7s} "
                      f"got={cell['got'].get('cause')} {cell['got'].get('ranks')}", flush=True)
    elif not args.report_only:
        for name in args.names or sorted(specs):
            for mode in modes_of(specs[name]):
                if args.mode and mode != args.mode:
                    continue
                cell = run_one(specs[name], mode, args.out)
                old = results.get(f"{name}/{mode}")
                if old is not None:  # keep earlier runs' judgements: a verdict that flips shows
                    cell["history"] = [*old.get("history", []), _judgement(old)]
                results[f"{name}/{mode}"] = cell
                RESULTS.write_text(json.dumps(results, indent=1, default=str) + "\n")
                got = cell.get("got", {})
                print(f"{name:32s} {mode:5s} cause={cell['cause']:7s} "
                      f"culprit={cell['culprit']:7s} got={got.get('cause')} "
                      f"{got.get('ranks')} rc={cell['returncodes']} "
                      f"{cell['run_error'] or ''}", flush=True)
    text = write_doc(results, specs)
    print(text.split("## Cells")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
