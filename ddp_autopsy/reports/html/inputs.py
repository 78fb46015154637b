"""What was read, what was not examined, and the bundles' collection metadata."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ddp_autopsy.reports import wording
from ddp_autopsy.reports.html.common import (
    MAX_ACTIONS,
    MAX_INPUT_ROWS,
    clean,
    code_spans,
)
from ddp_autopsy.rules.engine import Analysis, get_rule


@dataclass
class InputsView:
    rows: list[dict[str, Any]]
    more: int
    by_kind: list[tuple[str, int]]
    notes: list[dict[str, str]]
    not_evaluated: list[dict[str, Any]]  # rules grouped by why: {rules, why}
    errored: list[dict[str, str]]
    ruled_out: list[dict[str, str]]
    fired: list[dict[str, str]]


def inputs_view(analysis: Analysis) -> InputsView:
    job = analysis.job
    rows = [{"path": clean(i.path, 300), "kind": i.kind, "lines": i.lines, "bytes": i.bytes,
             "events": i.events} for i in job.inputs[:MAX_INPUT_ROWS]]
    kinds = Counter(i.kind for i in job.inputs)

    def rule_row(code: str, slug: str, **extra: str) -> dict[str, str]:
        rule = get_rule(code)
        return {"rule": code, "slug": slug, "title": rule.title() if rule else "", **extra}

    not_eval: list[dict[str, Any]] = []
    errored, ruled_out, fired = [], [], []
    for o in analysis.outcomes:
        if o.status == "not_evaluated":
            why = wording.not_examined(o)
            group = next((g for g in not_eval if g["text"] == why), None)
            if group is None:
                group = {"text": why, "why": code_spans(why), "rules": []}
                not_eval.append(group)
            group["rules"].append(rule_row(o.rule, o.slug))
        elif o.status == "errored":
            tb = (o.error or "").strip()
            errored.append(rule_row(o.rule, o.slug, last=clean(tb.splitlines()[-1] if tb else "?",
                                                               300),
                                    traceback=clean(tb, 8000)))
        elif o.status == "ruled_out":
            ruled_out.append(rule_row(o.rule, o.slug))
        else:
            fired.append(rule_row(o.rule, o.slug,
                                  ids=", ".join(f.id for f in o.findings)))
    return InputsView(
        rows=rows, more=max(0, len(job.inputs) - MAX_INPUT_ROWS), by_kind=sorted(kinds.items()),
        notes=[{"path": clean(n.path, 300), "level": n.level, "message": clean(n.message, 600)}
               for n in job.notes[:MAX_INPUT_ROWS]],
        not_evaluated=not_eval, errored=errored, ruled_out=ruled_out, fired=fired,
    )


@dataclass
class BundleView:
    display: str
    facts: list[tuple[str, str]]
    job: list[tuple[str, str]]
    processes: str
    actions: dict[str, int]
    problems: list[dict[str, str]]
    warnings: list[str]


def _scalar(v: Any) -> str:
    if isinstance(v, list):
        return clean(" ".join(str(x) for x in v), 400)
    if isinstance(v, dict):
        return clean(json.dumps(v, default=str), 400)
    return clean(v, 300)


def _seconds(v: Any) -> str | None:
    """``0.273`` → ``0.27 s``; ``30`` → ``30 s``; anything else as it is."""
    if isinstance(v, bool) or v is None:
        return None if v is None else str(v)
    if isinstance(v, int | float):
        return f"{v:.2f} s" if v < 10 else f"{v:,.0f} s"
    return str(v)


def bundle_views(job: Any) -> list[BundleView]:
    out = []
    for b in job.bundles:
        man = b.manifest if isinstance(b.manifest, dict) else {}
        tool = man.get("tool") if isinstance(man.get("tool"), dict) else {}
        complete = man.get("complete")
        facts = [("host", man.get("host")), ("collected at", man.get("created")),
                 ("complete", None if complete is None else "yes" if complete is True
                  else "no: some steps failed or timed out (see below)"),
                 ("took", _seconds(man.get("duration_s"))),
                 ("deadline", _seconds(man.get("deadline_s"))),
                 ("step timeout", _seconds(man.get("step_timeout_s"))),
                 ("tool", f"{tool.get('name', '?')} {tool.get('version', '?')}" if tool else None),
                 ("schema", man.get("schema"))]
        jobd = man.get("job") if isinstance(man.get("job"), dict) else {}
        procs = [p for p in man.get("processes") or [] if isinstance(p, dict)]
        roles = Counter(str(p.get("role")) for p in procs)
        stacks = Counter(str(p.get("stack_status")) for p in procs)
        proc_text = ", ".join(f"{n} {r}" for r, n in roles.most_common())
        if stacks:
            proc_text += "; stacks: " + ", ".join(f"{n} {s}" for s, n in stacks.most_common())
        actions = [a for a in man.get("actions") or [] if isinstance(a, dict)]
        problems = []
        for a in actions:
            if a.get("status") not in (None, "ok") or a.get("timeout_hit") or a.get("truncated"):
                problems.append({
                    "name": _scalar(a.get("name")), "status": _scalar(a.get("status")),
                    "command": _scalar(a.get("command") or a.get("target") or a.get("path")),
                    "exit_code": _scalar(a.get("exit_code")),
                    "duration": _scalar(a.get("duration_s")),
                    "timeout": "timeout hit" if a.get("timeout_hit") else "",
                    "truncated": "truncated" if a.get("truncated") else "",
                    "error": _scalar(a.get("error")),
                })
        out.append(BundleView(
            display=clean(b.display, 300),
            facts=[(k, _scalar(v)) for k, v in facts if v is not None],
            job=[(clean(k, 60), _scalar(v)) for k, v in jobd.items() if v not in (None, [], "")],
            processes=proc_text,
            actions=dict(Counter(str(a.get("status")) for a in actions)),
            problems=problems[:MAX_ACTIONS],
            warnings=[_scalar(w) for w in (man.get("warnings") or [])[:50]],
        ))
    return out
