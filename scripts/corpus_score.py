"""Score the verdict against real users' logs: ``tests/corpus/*/truth.json``.

    python scripts/corpus_score.py [CORPUS_DIR ...] [--verbose] [--json]

For each incident, analyze its log files (never truth.json) and compare the verdict's cause and
culprit ranks with the truth. Prints one line per incident, the totals, per-cause precision and
recall, and the confusion matrix (truth → verdict). The corpus labels a few classes more narrowly
or broadly than the tool's vocabulary; ``SAME`` maps them.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

# truth label -> verdict causes that mean the same thing
SAME = {
    # The label names the symptom; a verdict naming the configuration error behind it is right.
    "store_timeout_missing_rank": {"missing_ranks", "config_mismatch"},
    "shm_too_small": {"shm_failure"},
    "rank_crashed": {"rank_crashed", "out_of_memory"},
}
DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "corpus"


@dataclass
class Case:
    name: str
    truth: str
    culprits: list[int]
    verdict: str | None
    ranks: list[int]
    cause_ok: bool
    ranks_ok: bool
    summary: str | None
    errored: list[str] = field(default_factory=list)  # rules that raised on the case


def score_case(case: Path) -> Case:
    truth = json.loads((case / "truth.json").read_text())
    files = [p for p in case.iterdir() if p.name != "truth.json"]
    analysis = run(load(files))
    verdict = analysis.verdict
    want = SAME.get(truth["cause"], {truth["cause"]})
    got = verdict.cause if verdict else None
    culprits = truth.get("culprit_ranks") or []
    cause_ok = got in want
    ranks_ok = cause_ok and (not culprits or set(verdict.ranks) == set(culprits))
    return Case(case.name, truth["cause"], culprits, got, verdict.ranks if verdict else [],
                cause_ok, ranks_ok, verdict.summary if verdict else None,
                [o.rule for o in analysis.outcomes if o.status == "errored"])


def cases_in(roots: list[Path]) -> list[Path]:
    return sorted((p for root in roots for p in root.iterdir() if (p / "truth.json").exists()),
                  key=lambda p: p.name)


def score(roots: list[Path], verbose: bool = False, out=sys.stdout) -> list[Case]:
    results = []
    for case in cases_in(roots):
        c = score_case(case)
        results.append(c)
        mark = "ok " if c.ranks_ok else ("~  " if c.cause_ok else "MISS")
        print(f"{mark} {c.name:10s} truth={c.truth}{c.culprits or ''}  verdict={c.verdict}"
              f"{c.ranks or ''}", file=out)
        if verbose and c.summary:
            print(f"      {c.summary}", file=out)
    report(results, out)
    return results


def report(results: list[Case], out=sys.stdout) -> None:
    n = len(results)
    if not n:
        print("no cases", file=out)
        return
    cause_ok = sum(c.cause_ok for c in results)
    ranks_ok = sum(c.ranks_ok for c in results)
    named = [c for c in results if c.culprits]
    silent = [c.name for c in results if c.verdict is None]
    print(f"\ncause right: {cause_ok}/{n} ({100 * cause_ok / n:.0f} %); cause and culprit ranks "
          f"right: {ranks_ok}/{n}; culprit right where the truth names one: "
          f"{sum(c.ranks_ok for c in named)}/{len(named)}; no verdict: {len(silent)} "
          f"{' '.join(silent)}", file=out)
    # Per cause: precision over the verdicts that named it, recall over the truths that are it.
    truths = Counter(c.truth for c in results)
    verdicts = Counter(c.verdict for c in results)
    hits = Counter(c.truth for c in results if c.cause_ok)
    hit_verdicts = Counter(c.verdict for c in results if c.cause_ok)
    print(f"\n{'cause':32s} {'truth':>5s} {'recall':>7s} {'named':>5s} {'precision':>9s}",
          file=out)
    for cause in sorted(set(truths) | {v for v in verdicts if v}):
        t, v = truths.get(cause, 0), verdicts.get(cause, 0)
        recall = f"{100 * hits[cause] / t:.0f} %" if t else "-"
        precision = f"{100 * hit_verdicts[cause] / v:.0f} %" if v else "-"
        print(f"{cause:32s} {t:5d} {recall:>7s} {v:5d} {precision:>9s}", file=out)
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for c in results:
        if not c.cause_ok:
            confusion[c.truth][str(c.verdict)] += 1
    if confusion:
        print("\nconfusion (truth → wrong verdicts):", file=out)
        for truth in sorted(confusion):
            wrong = ", ".join(f"{v} ×{k}" for v, k in confusion[truth].most_common())
            print(f"  {truth:30s} → {wrong}", file=out)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    results = score([Path(a) for a in args] or [DEFAULT], verbose="--verbose" in sys.argv,
                    out=sys.stderr if "--json" in sys.argv else sys.stdout)
    if "--json" in sys.argv:
        print(json.dumps([asdict(c) for c in results], indent=1))
