"""The verdict and findings: evidence lines shown in their context."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from markupsafe import Markup

from ddp_autopsy.reports import wording
from ddp_autopsy.reports.html.common import (
    CONTEXT_MAX_BYTES,
    CONTEXT_RADIUS,
    STACK_CONTEXT,
    clean,
    code_spans,
    doc_html,
)
from ddp_autopsy.rules.base import Evidence, Finding
from ddp_autopsy.rules.engine import get_rule


@dataclass
class ContextLine:
    number: int | None
    text: str
    hit: bool = False
    anchor: str | None = None  # id of the evidence this line is


@dataclass
class EvidenceBlock:
    """Evidence lines of one finding shown together: neighbouring lines of one file share one
    window of context, each hit line keeping its own anchor."""

    path: str
    refs: list[tuple[str, str]]  # (anchor, "line 13" / "" ) of each evidence in the block
    who: str
    context: list[ContextLine]
    context_from: str
    text: str  # shown when there is no context
    anchor: str | None = None  # the block's id, for evidence not anchored on a line


@dataclass
class EvidenceView:
    anchor: str
    location: str
    rank: int | None
    host: str | None
    text: str
    context: list[ContextLine] = field(default_factory=list)
    context_from: str = ""  # "file" | "events" | "stack" | ""


@dataclass
class FindingView:
    id: str
    rule: str
    slug: str
    title: str
    cause: str | None
    role: str
    role_label: str
    severity: str
    summary: str
    who: str
    time: str | None
    confidence: int
    remedy: Markup
    explained_by: str | None
    evidence: list[EvidenceView]
    blocks: list[EvidenceBlock]
    details: list[tuple[str, str]]
    doc: list[tuple[str, Markup]]


class ContextReader:
    """Lines around evidence lines: from the file when it is still readable (plain, not in an
    archive), else from the recognised events of the same source."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.windows: dict[str, dict[int, str]] = {}

    def prefetch(self, evidence: Iterable[Evidence]) -> None:
        wanted: dict[str, set[int]] = defaultdict(set)
        for ev in evidence:
            if ev.line is not None and ev.line > 0:
                wanted[ev.path].update(range(max(1, ev.line - CONTEXT_RADIUS),
                                             ev.line + CONTEXT_RADIUS + 1))
        for path, lines in wanted.items():
            self.windows[path] = self._read(path, lines)

    @staticmethod
    def _read(path: str, lines: set[int]) -> dict[int, str]:
        p = Path(path)
        if "!" in path or p.suffix.lower() in (".gz", ".bz2", ".xz", ".zst") or not p.is_file():
            return {}
        got: dict[int, str] = {}
        last = max(lines)
        read = 0
        try:
            with open(p, "rb") as fh:
                for n, raw in enumerate(fh, 1):
                    read += len(raw)
                    if n in lines:
                        got[n] = raw.decode("utf-8", "replace").rstrip("\r\n")
                    if n >= last or read > CONTEXT_MAX_BYTES:
                        break
        except OSError:
            return {}
        return got

    def context(self, ev: Evidence) -> tuple[list[ContextLine], str]:
        if ev.line is None:
            return self._stack(ev)
        lo, hi = max(1, ev.line - CONTEXT_RADIUS), ev.line + CONTEXT_RADIUS
        window = self.windows.get(ev.path) or {}
        if ev.line in window:
            return [ContextLine(n, clean(window[n]), n == ev.line)
                    for n in range(lo, hi + 1) if n in window], "file"
        events = self.job.events
        if events.height == 0:
            return [], ""
        near = (events.filter((pl.col("source") == ev.path) & pl.col("line").is_between(lo, hi))
                .select("line", "text").unique("line", keep="first").sort("line"))
        if near.height <= 1:
            return [], ""
        return [ContextLine(n, clean(t), n == ev.line) for n, t in near.iter_rows()], "events"


    def _stack(self, ev: Evidence) -> tuple[list[ContextLine], str]:
        """For evidence from a stack dump: the main thread's innermost frames."""
        stacks = self.job.stacks
        if stacks.height == 0:
            return [], ""
        rows = stacks.filter(pl.col("source") == ev.path)
        if rows.height == 0:
            return [], ""
        main = rows.filter(pl.col("thread_id") == pl.col("pid"))
        if main.height == 0:
            main = rows.filter(pl.col("thread_name") == "MainThread")
        if main.height == 0:
            main = rows.filter(pl.col("thread_id") == rows["thread_id"][0])
        main = main.sort("depth")
        out = []
        for func, file, line in main.select("func", "file", "line").head(STACK_CONTEXT)\
                .iter_rows():
            text = f"{func} ({file}:{line})" if line is not None else f"{func} ({file})"  # native
            out.append(ContextLine(None, clean(text), text in ev.text))
        if main.height > STACK_CONTEXT:
            out.append(ContextLine(None, f"… {main.height - STACK_CONTEXT} outer frames"))
        return out, "stack"




def finding_view(f: Finding, reader: ContextReader) -> FindingView:
    rule = get_rule(f.rule)
    evidence = []
    for i, ev in enumerate(f.evidence, 1):
        ctx, origin = reader.context(ev)
        evidence.append(EvidenceView(
            anchor=f"{f.id}-e{i}", location=clean(ev.location, 300), rank=ev.rank,
            host=clean(ev.host, 120) if ev.host else None, text=clean(ev.text.strip()),
            context=ctx, context_from=origin,
        ))
    details = []
    blocks = _blocks(f, evidence)
    for key, value in f.details.items():
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        details.append((clean(key, 80), clean(shown, 300)))
    doc: list[tuple[str, Markup]] = []
    if rule is not None:
        sections = rule.sections()
        for name in ("What it detects", "Why it hangs or kills the job", "Evidence"):
            if sections.get(name):
                doc.append((name, doc_html(sections[name])))
    role_label = wording.role_label(f)
    return FindingView(
        id=f.id, rule=f.rule, slug=f.slug, title=rule.title() if rule else f.slug,
        cause=f.cause, role=f.role, role_label=role_label, severity=f.severity,
        summary=clean(f.summary, 2000), who=wording.who(f, lambda h: clean(h, 80)),
        time=f.ts.isoformat(sep=" ") if f.ts else None,
        confidence=round(f.confidence * 100), remedy=code_spans(clean(f.remedy, 2000)),
        explained_by=f.explained_by, evidence=evidence, blocks=blocks, details=details,
        doc=doc,
    )


def _blocks(f: Finding, views: list[EvidenceView]) -> list[EvidenceBlock]:
    blocks: list[EvidenceBlock] = []
    for ev, view in zip(f.evidence, views, strict=True):
        who = " · ".join(x for x in (f"rank {ev.rank}" if ev.rank is not None else "",
                                     view.host or "") if x)
        ref = (view.anchor, f"{ev.line}" if ev.line is not None else "")
        last = blocks[-1] if blocks else None
        numbers = [c.number for c in view.context if c.number is not None]
        if (last is not None and numbers and last.context_from == view.context_from
                and last.context_from in ("file", "events") and last.path == view.location
                .rsplit(":", 1)[0] and min(numbers) <= max(
                    c.number for c in last.context if c.number is not None) + 1):
            merged = {c.number: c for c in last.context}
            for c in view.context:
                if c.number in merged and not c.hit:
                    continue
                merged[c.number] = c
            last.context = [merged[n] for n in sorted(merged)]  # type: ignore[type-var]
            last.refs.append(ref)
            if who and who not in last.who:
                last.who = f"{last.who}; {who}" if last.who else who
        else:
            path = view.location.rsplit(":", 1)[0] if ev.line is not None else view.location
            blocks.append(EvidenceBlock(path, [ref], who, list(view.context),
                                        view.context_from, view.text))
        for c in blocks[-1].context:
            if c.hit and c.number == ev.line and c.anchor is None:
                c.anchor = view.anchor
    for b in blocks:
        if b.context_from in ("file", "events"):  # mark skipped lines
            spaced: list[ContextLine] = []
            for c in b.context:
                if spaced and c.number is not None and spaced[-1].number is not None \
                        and c.number > spaced[-1].number + 1:
                    spaced.append(ContextLine(None, "⋯"))
                spaced.append(c)
            b.context = spaced
        on_rows = {c.anchor for c in b.context if c.anchor}
        b.anchor = next((a for a, _ in b.refs if a not in on_rows), None)
    return blocks
