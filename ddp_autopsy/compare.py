"""``ddp-autopsy compare A B``: two runs (logs, bundles) side by side.

What differs: the verdict; versions and environment (from bundles' process records, and the
version lines logs print); ranks whose state or innermost frame changed, or that only one run
has; findings new in B and gone since A (matched by rule and the ranks they name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_autopsy.rules.engine import Analysis

SCHEMA_ID = "ddp-autopsy/compare/1"


@dataclass
class Comparison:
    a: Analysis
    b: Analysis
    verdicts: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None)
    env: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    gone: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_ID,
                "verdict": {"a": self.verdicts[0], "b": self.verdicts[1],
                            "same": _same_verdict(*self.verdicts)},
                "env": self.env, "ranks": self.ranks,
                "findings": {"new": self.new, "gone": self.gone}}


def _verdict(analysis: Analysis) -> dict[str, Any] | None:
    v = analysis.verdict
    return None if v is None else {"rule": v.rule, "cause": v.cause, "ranks": sorted(set(v.ranks)),
                                   "summary": v.summary}


def _same_verdict(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a["cause"], a["ranks"]) == (b["cause"], b["ranks"])


def _env(analysis: Analysis) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for row in analysis.job.env.iter_rows(named=True):
        out.setdefault(row["key"], set()).add(row["value"])
    return out


def _key(f: Any) -> tuple[str, tuple[int, ...]]:
    return f.rule, tuple(sorted(set(f.ranks)))


def _brief(f: Any) -> dict[str, Any]:
    return {"rule": f.rule, "slug": f.slug, "role": f.role, "cause": f.cause,
            "ranks": sorted(set(f.ranks)), "summary": f.summary}


def compare(a: Analysis, b: Analysis) -> Comparison:
    out = Comparison(a, b, (_verdict(a), _verdict(b)))
    ea, eb = _env(a), _env(b)
    for key in sorted(set(ea) | set(eb)):
        va, vb = sorted(ea.get(key, ())), sorted(eb.get(key, ()))
        if va != vb:
            out.env.append({"key": key, "a": va, "b": vb})
    rows_a = {r["rank"]: r for r in a.job.rank_state.iter_rows(named=True)
              if r["state"] != "missing"}
    rows_b = {r["rank"]: r for r in b.job.rank_state.iter_rows(named=True)
              if r["state"] != "missing"}
    for rank in sorted(set(rows_a) | set(rows_b)):
        ra, rb = rows_a.get(rank), rows_b.get(rank)
        pick = lambda r, k: None if r is None else r[k]  # noqa: E731
        if ra is None or rb is None or (ra["state"], ra["frame"]) != (rb["state"], rb["frame"]):
            out.ranks.append({"rank": rank,
                              "a": {"state": pick(ra, "state"), "frame": pick(ra, "frame")},
                              "b": {"state": pick(rb, "state"), "frame": pick(rb, "frame")}})
    keys_a = {_key(f) for f in a.findings}
    keys_b = {_key(f) for f in b.findings}
    out.new = [_brief(f) for f in b.findings if _key(f) not in keys_a]
    out.gone = [_brief(f) for f in a.findings if _key(f) not in keys_b]
    return out


def render_text(c: Comparison, name_a: str, name_b: str) -> str:
    va, vb = c.verdicts
    lines = [f"A: {name_a}", f"B: {name_b}", ""]
    said = lambda v: "no root cause" if v is None else \
        f"{v['cause']} ({v['rule']}), ranks {v['ranks']}: {v['summary']}"  # noqa: E731
    if _same_verdict(va, vb):
        lines.append(f"Verdict: the same in both: {said(va)}")
    else:
        lines += ["Verdict differs", f"  A  {said(va)}", f"  B  {said(vb)}"]
    lines.append("")
    if c.env:
        lines.append(f"Versions and environment that differ ({len(c.env)})")
        for e in c.env:
            both = f"A {', '.join(e['a']) or '-'}  B {', '.join(e['b']) or '-'}"
            lines.append(f"  {e['key']}: {both}")
    else:
        lines.append("Versions and environment: no difference seen")
    lines.append("")
    if c.ranks:
        lines.append(f"Ranks whose state or frame changed ({len(c.ranks)})")
        for r in c.ranks[:50]:
            a, b = r["a"], r["b"]
            lines.append(f"  rank {r['rank']}: A {a['state'] or 'absent'}"
                         f"{' in ' + a['frame'] if a['frame'] else ''}  ->  B "
                         f"{b['state'] or 'absent'}{' in ' + b['frame'] if b['frame'] else ''}")
        if len(c.ranks) > 50:
            lines.append(f"  … {len(c.ranks) - 50} more (--format json has them all)")
    else:
        lines.append("Ranks: every rank in the same state and frame")
    for title, items in (("New in B", c.new), ("Gone since A", c.gone)):
        lines.append("")
        lines.append(f"{title} ({len(items)})")
        lines += [f"  {f['rule']} [{f['role']}] {f['summary']}" for f in items]
    return "\n".join(lines)
