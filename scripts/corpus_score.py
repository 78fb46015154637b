"""Score the verdict against real users' logs: ``shared/corpus/*/truth.json``.

    python scripts/corpus_score.py [CORPUS_DIR] [--verbose]

For each incident, analyze its log files (never truth.json) and compare the verdict's cause and
culprit ranks with the truth. Prints one line per incident and the totals. The corpus labels a
few classes more narrowly or broadly than the tool's vocabulary; ``SAME`` maps them.
"""

from __future__ import annotations

import json
import sys
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


def score(corpus: Path, verbose: bool = False) -> tuple[int, int, int]:
    cause_ok = ranks_ok = total = 0
    for case in sorted(p for p in corpus.iterdir() if (p / "truth.json").exists()):
        truth = json.loads((case / "truth.json").read_text())
        files = [p for p in case.iterdir() if p.name != "truth.json"]
        verdict = run(load(files)).verdict
        want = SAME.get(truth["cause"], {truth["cause"]})
        got = verdict.cause if verdict else None
        c_ok = got in want
        culprits = truth.get("culprit_ranks") or []
        r_ok = c_ok and (not culprits or set(verdict.ranks) == set(culprits))
        total += 1
        cause_ok += c_ok
        ranks_ok += r_ok
        mark = "ok " if r_ok else ("~  " if c_ok else "MISS")
        line = f"{mark} {case.name:10s} truth={truth['cause']}{culprits or ''}  verdict={got}"
        if verdict is not None:
            line += f"{verdict.ranks or ''}"
        print(line)
        if verbose and verdict is not None:
            print(f"      {verdict.summary}")
    print(f"\ncause right: {cause_ok}/{total}; cause and culprit ranks right: {ranks_ok}/{total}")
    return cause_ok, ranks_ok, total


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "shared" / "corpus"
    score(root, verbose="--verbose" in sys.argv)
