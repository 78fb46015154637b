"""The HTML post-mortem: one self-contained, shareable file (``ddp-autopsy report -o FILE``).

The page is built in two steps: this module turns an :class:`Analysis` into plain view objects
(every log-derived string redacted and truncated here), then ``templates/report.html.j2`` renders
them with Jinja autoescaping on. CSS, JS and SVG are inline; a Content-Security-Policy allows no
network access at all and only the report's own script (by hash). Everything is readable with
JavaScript off; the script only adds filtering, a theme switch and print helpers.

Sections: verdict, findings (evidence lines in context, anchors ``#F1``, ``#F1-e1``), merged stacks
(:mod:`ddp_autopsy.analyzer.stacktree`), rank-state grid, timeline (SVG), versions and environment
(only what differs), inputs and what was not examined, collection metadata. The analysis JSON
(``ddp-autopsy/analysis/1``) is embedded as ``<script type="application/json"
id="ddp-autopsy-analysis">``. See docs/report.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from ddp_autopsy import __version__
from ddp_autopsy.analyzer import stacktree
from ddp_autopsy.analyzer.stacktree import Node, StackTree, short_ranks
from ddp_autopsy.redact import MASK, is_secret_name, redact_obj, redact_text
from ddp_autopsy.reports import json_report
from ddp_autopsy.rules.base import Evidence, Finding
from ddp_autopsy.rules.engine import Analysis, get_rule

LINE_LIMIT = 400  # characters of one log line shown
CONTEXT_RADIUS = 3  # lines shown before and after an evidence line
CONTEXT_MAX_BYTES = 256 << 20  # give up reading a log for context past this
STACK_CONTEXT = 10  # innermost frames shown for evidence from a stack dump
MAX_CHILDREN = 12  # tree branches shown per node (the rest summarised)
MAX_TREE_NODES = 400
RUN_HEAD, RUN_TAIL = 3, 5  # frames shown around a folded run of frames
MAX_CLASSES = 40
MAX_INPUT_ROWS = 400
MAX_ENV_VALUES = 6
MAX_ACTIONS = 200
GRID_FOLD_ABOVE = 8192  # ranks; beyond, uniform rows of the grid are folded into bars
TIMELINE_MAX_LANES = 32
TIMELINE_MAX_MARKS = 3000


# --------------------------------------------------------------------------- text helpers


def clean(text: Any, limit: int = LINE_LIMIT) -> str:
    """A log-derived string made safe to share: secrets redacted, length bounded.

    (HTML escaping is the template's job: autoescape is on for every template.)
    """
    if text is None:
        return ""
    s = redact_text(str(text))
    s = s.replace("\r", "")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def doc_html(text: str) -> Markup:
    """Rule documentation (markdown-ish) as HTML: paragraphs, ``code`` spans, fenced blocks."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fenced = re.match(r"```[^\n]*\n(.*?)\n?```$", block.strip(), re.S)
        if fenced:
            out.append(f"<pre>{escape(fenced.group(1))}</pre>")
            continue
        out.append(f"<p>{code_spans(' '.join(block.split()))}</p>")
    return Markup("".join(out))


def code_spans(text: str) -> Markup:
    """Escaped text with ```code``` spans as ``<code>``.

    >>> str(code_spans("run `dist.barrier()` <now>"))
    'run <code>dist.barrier()</code> &lt;now&gt;'
    """
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


def script_json(obj: Any) -> Markup:
    """JSON safe inside ``<script type="application/json">``: ``<``, ``>``, ``&`` are escaped,
    so neither ``</script>`` nor ``<!--`` can end or bend the element.

    >>> str(script_json({"t": "</script><!--"}))
    '{"t": "\\\\u003c/script\\\\u003e\\\\u003c!--"}'
    """
    s = json.dumps(obj, default=str, ensure_ascii=False)
    s = s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    s = s.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return Markup(s)


def _who(ranks: Sequence[int], hosts: Sequence[str]) -> str:
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {short_ranks(ranks, 12)}")
    if hosts:
        shown = ", ".join(clean(h, 80) for h in hosts[:6])
        more = f" +{len(hosts) - 6}" if len(hosts) > 6 else ""
        parts.append(f"host{'s' if len(hosts) > 1 else ''} {shown}{more}")
    return " · ".join(parts)


# --------------------------------------------------------------------------- findings


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


class _ContextReader:
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
            text = f"{func} ({file}:{line})"
            out.append(ContextLine(None, clean(text), text in ev.text))
        if main.height > STACK_CONTEXT:
            out.append(ContextLine(None, f"… {main.height - STACK_CONTEXT} outer frames"))
        return out, "stack"


ROLE_LABEL = {"root_cause": "root cause", "symptom": "symptom", "info": "info"}


def _finding_view(f: Finding, reader: _ContextReader) -> FindingView:
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
    role_label = ROLE_LABEL.get(f.role, f.role)
    if f.role == "symptom" and f.explained_by:
        role_label = f"symptom of {f.explained_by}"
    return FindingView(
        id=f.id, rule=f.rule, slug=f.slug, title=rule.title() if rule else f.slug,
        cause=f.cause, role=f.role, role_label=role_label, severity=f.severity,
        summary=clean(f.summary, 2000), who=_who(sorted(set(f.ranks)), sorted(set(f.hosts))),
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


# --------------------------------------------------------------------------- merged stacks


@dataclass
class FrameView:
    func: str
    loc: str
    library: bool
    collective: bool


@dataclass
class NodeView:
    anchor: str | None  # id of the class ending here
    label: str
    count: int
    share: str  # percent of the tree's processes
    outlier: bool
    thread: str | None
    head: list[FrameView]
    folded: list[FrameView]
    tail: list[FrameView]
    here: int
    here_idle: int
    here_what: str
    children: list[NodeView] = field(default_factory=list)
    more: str | None = None  # "… 12 more branches (ranks …)"


@dataclass
class ClassView:
    id: str
    anchor: str | None  # None when its branch is cut from the rendered tree
    label: str
    size: int
    where: str
    place: str | None
    collective: str | None
    outlier: bool
    diverges_at: str | None
    threads: str


@dataclass
class TreeView:
    title: str
    summary: str
    processes: int
    root: list[NodeView]
    classes: list[ClassView]
    more_classes: int
    truncated: bool


def _frame_text(f: stacktree.Frame | None) -> str:
    return clean(str(f), 300) if f is not None else ""


def _frame_view(f: stacktree.Frame) -> FrameView:
    loc = f"{f.file}:{f.line}" if f.line is not None else (f.file or "")
    return FrameView(clean(f.func, 200), clean(loc, 300), stacktree.is_library(f),
                     stacktree.is_collective(f))


def _tree_view(tree: StackTree, prefix: str, title: str, unit: str = "process") -> TreeView:
    total = max(1, len(tree.procs))
    budget = [MAX_TREE_NODES]
    truncated = False
    rendered: set[str] = set()  # classes whose end node is shown (their table links work)

    def view(node: Node) -> NodeView:
        nonlocal truncated
        budget[0] -= 1
        frames = [_frame_view(f) for f in node.frames]
        if len(frames) > RUN_HEAD + RUN_TAIL + 2:
            head, folded, tail = frames[:RUN_HEAD], frames[RUN_HEAD:-RUN_TAIL], frames[-RUN_TAIL:]
        else:
            head, folded, tail = frames, [], []
        ends = [tree.procs[m] for m in node.ends]
        ending = [tree.classes[c] for c in node.ending]
        what = ""
        if ending:
            c = ending[0]
            what = f"waiting in {c.collective.func}" if c.collective else (c.place or "")
            rendered.add(c.id)
        v = NodeView(
            anchor=f"{prefix}{ending[0].id}" if ending else None, label=node.label,
            count=node.count, share=_percent(node.count, total), outlier=node.outlier,
            thread=clean(node.thread, 120) if node.thread else None,
            head=head, folded=folded, tail=tail, here=len(ends),
            here_idle=sum(p.idle for p in ends), here_what=what,
        )
        shown = node.children[:MAX_CHILDREN]
        for child in shown:
            if budget[0] <= 0:
                truncated = True
                break
            v.children.append(view(child))
        hidden = node.children[len(v.children):]
        if hidden:
            members = [tree.procs[m] for c in hidden for m in c.members]
            v.more = (f"{len(hidden)} more branch{'es' if len(hidden) > 1 else ''} "
                      f"({stacktree.who(members)})")
        return v

    roots = [view(c) for c in tree.root.children[:MAX_CHILDREN]]
    classes = [
        ClassView(
            id=c.id, anchor=f"{prefix}{c.id}" if c.id in rendered else None, label=c.label,
            size=c.size, where=_frame_text(c.user_frame), place=c.place,
            collective=c.collective.func if c.collective else None, outlier=c.outlier,
            diverges_at=_frame_text(c.diverges_at) or None,
            threads=", ".join(clean(t, 80) for t in c.threads),
        )
        for c in tree.classes[:MAX_CLASSES]
    ]
    return TreeView(title=title, summary=_tree_summary(tree, unit),
                    processes=len(tree.procs), root=roots, classes=classes,
                    more_classes=max(0, len(tree.classes) - MAX_CLASSES),
                    truncated=truncated or len(tree.root.children) > MAX_CHILDREN)


def _percent(n: int, total: int) -> str:
    """``"<1%"`` and ``">99%"`` rather than a rounded 0 or 100 that hides the odd one out."""
    pct = 100 * n / max(total, 1)
    if 0 < pct < 1:
        return "<1%"
    if 99 < pct < 100:
        return ">99%"
    return f"{round(pct)}%"


def _tree_summary(tree: StackTree, unit: str = "process") -> str:
    n, k = len(tree.procs), len(tree.classes)
    if n == 0:
        return "No stacks."
    units = unit + ("es" if unit.endswith("s") else "s")
    text = f"{n} {unit if n == 1 else units} in {k} distinct stack{'s' if k != 1 else ''}."
    big = tree.majority
    if big is not None and k > 1:
        where = (f"waits in {big.collective.func}" if big.collective
                 else f"is in {clean(str(big.user_frame), 200)}" if big.user_frame else "agrees")
        text += f" The largest group, {big.label} ({big.size}), {where}."
    outs = tree.outliers
    if outs:
        parts = []
        for c in outs[:4]:
            at = f"in {c.collective.func}" if c.collective else \
                f"in {clean(str(c.user_frame), 200)}" if c.user_frame else "elsewhere"
            parts.append(f"{c.label} {at}" + (f" ({c.place})" if c.place else ""))
        more = f" and {len(outs) - 4} more" if len(outs) > 4 else ""
        text += f" Outlier{'s' if len(outs) > 1 else ''}: {'; '.join(parts)}{more}."
    return text


# --------------------------------------------------------------------------- rank-state grid

#: Grid states, most telling first: the verdict's culprits and the ranks the launcher stopped
#: are the analysis' marks; every other state is the job's per-rank table (analyzer/rankstate.py).
STATES: tuple[tuple[str, str, str], ...] = (
    ("culprit", "culprit", "named by the verdict"),
    ("crashed", "crashed", "raised, exited with an error or ran out of memory"),
    ("elsewhere", "outside collective", "its stack is outside any collective"),
    ("failed", "timed out / lost peer", "failed waiting for the others"),
    ("waiting", "waiting in collective", "its stack waits in a torch.distributed call"),
    ("frozen", "frozen", "its stack could not be taken in time (stopped, or the GIL held)"),
    ("terminated", "terminated", "stopped by the launcher after another failure"),
    ("exited", "exited", "its process was gone when collected"),
    ("seen", "seen, no failure", "in the logs or stacks, nothing wrong"),
    ("nodata", "no data", "within the world size, but absent from every input"),
)
#: The per-rank table's state → the grid's (CSS class) name.
GRID_STATE = {"busy": "elsewhere", "missing": "nodata"}


@dataclass
class Cell:
    rank: int
    state: str
    title: str


@dataclass
class GridRow:
    label: str
    cells: list[Cell]
    #: Huge jobs: several full rows of one state folded into one bar (``cells`` is then empty).
    band: Cell | None = None


@dataclass
class LegendItem:
    state: str
    label: str
    meaning: str
    count: int
    ranks: str


@dataclass
class GridView:
    rows: list[GridRow]
    legend: list[LegendItem]
    size: str  # "l" | "m" | "s": cell size class
    total: int
    note: str


def rank_states(analysis: Analysis) -> dict[int, tuple[str, str]]:
    """Rank → (grid state, why) for every rank the inputs name or the world size implies."""
    out: dict[int, tuple[str, str]] = {}
    for r, state, why in analysis.job.rank_state.select("rank", "state", "why").iter_rows():
        out[r] = (GRID_STATE.get(state, state), why or "")
    terminated = {r: f"{f.id} {f.rule} {f.slug}" for f in analysis.findings
                  if f.slug == "workers-terminated" for r in f.ranks}
    for r, why in terminated.items():
        if out.get(r, ("seen", ""))[0] in ("seen", "failed", "nodata"):
            out[r] = ("terminated", why)
    verdict = analysis.verdict
    if verdict is not None:
        for r in verdict.ranks:
            out[r] = ("culprit", f"{verdict.id} {verdict.rule} {verdict.slug}")
    return out


def _grid_view(analysis: Analysis) -> GridView | None:
    states = rank_states(analysis)
    if not states:
        return None
    host_of: dict[int, str] = {}
    if analysis.job.ranks.height:
        for r, hosts in analysis.job.ranks.select("rank", "hosts").iter_rows():
            if hosts:
                host_of[r] = clean(hosts[0], 60)
    n = len(states)
    cols = 16 if n <= 128 else 32 if n <= 1024 else 64
    size = "l" if n <= 256 else "m" if n <= 2048 else "s"
    ranks = sorted(states)
    rows: list[GridRow] = []
    for i in range(0, len(ranks), cols):
        chunk = ranks[i:i + cols]
        cells = []
        for r in chunk:
            state, why = states[r]
            host = f" · {host_of[r]}" if r in host_of else ""
            cells.append(Cell(r, state, f"rank {r}{host} · {_STATE_LABEL[state]}: {why}"))
        label = f"{chunk[0]}" if len(chunk) == 1 else f"{chunk[0]}–{chunk[-1]}"
        rows.append(GridRow(label, cells))
    folded = n > GRID_FOLD_ABOVE
    if folded:
        rows = _fold_rows(rows, cols)
    by_state: dict[str, list[int]] = defaultdict(list)
    for r, (s, _) in states.items():
        by_state[s].append(r)
    legend = [LegendItem(s, label, meaning, len(by_state[s]), short_ranks(by_state[s], 10))
              for s, label, meaning in STATES if by_state.get(s)]
    world = analysis.job.world_size
    note = (f"World size {world}." if world else
            "World size unknown: ranks 0 to the highest rank seen are shown.")
    if folded and any(r.band for r in rows):
        note += " Runs of full rows in one state are folded into one bar."
    return GridView(rows=rows, legend=legend, size=size, total=n, note=note)


_STATE_LABEL = {s: label for s, label, _ in STATES}


def _fold_rows(rows: list[GridRow], cols: int) -> list[GridRow]:
    """Fold runs of full, single-state rows into one bar each (bounded size past 8192 ranks)."""
    out: list[GridRow] = []
    run: list[GridRow] = []

    def flush() -> None:
        if len(run) >= 2:
            lo, hi = run[0].cells[0].rank, run[-1].cells[-1].rank
            state = run[0].cells[0].state
            out.append(GridRow(f"{lo}–{hi}", [], Cell(
                lo, state, f"ranks {lo}-{hi} · {_STATE_LABEL[state]} ({hi - lo + 1})")))
        else:
            out.extend(run)
        run.clear()

    for row in rows:
        states = {c.state for c in row.cells}
        uniform = len(row.cells) == cols and len(states) == 1
        if uniform and run and run[0].cells[0].state in states:
            run.append(row)
            continue
        flush()
        if uniform:
            run.append(row)
        else:
            out.append(row)
    flush()
    return out


# --------------------------------------------------------------------------- timeline

KIND_CATEGORY: dict[str, str] = {
    "run_start": "start",
    **{k: "failure" for k in ("exception", "worker_failed", "spawn_failed", "elastic_failure",
                              "oom", "nccl_error", "monitored_barrier_failed",
                              "collective_fingerprint_mismatch", "desync_never_joined",
                              "desync_not_joined")},
    **{k: "timeout" for k in ("watchdog_timeout", "watchdog_summary", "gloo_timeout",
                              "store_wait_timeout", "store_clients_timeout", "connect_timeout")},
    **{k: "network" for k in ("connect_failed", "connect_retry", "peer_closed",
                              "rdzv_connection_error", "port_in_use", "unresolved_host")},
    **{k: "signal" for k in ("agent_signal", "closing_signal")},
}
CATEGORIES = ("start", "failure", "timeout", "network", "signal", "other")
TL_LEFT, TL_RIGHT, TL_WIDTH, TL_LANE, TL_TOP = 150, 24, 1000, 18, 22


@dataclass
class Mark:
    x: float
    y: float
    cat: str
    title: str


@dataclass
class Tick:
    x: float
    label: str


@dataclass
class FindingLine:
    x: float
    y: float  # of its label (labels of close findings are staggered)
    id: str
    title: str
    anchor: str  # text-anchor of the label


@dataclass
class TimelineView:
    width: int
    height: int
    left: int
    right: int
    lanes: list[tuple[float, str]]
    ticks: list[Tick]
    marks: list[Mark]
    findings: list[FindingLine]
    categories: list[tuple[str, int]]
    caption: str


def _lane_expr(ev: pl.DataFrame) -> tuple[pl.Expr, str]:
    ranks = ev["rank"].drop_nulls()
    hosts = ev["host"].drop_nulls()
    other = pl.lit("launcher / other")
    if 0 < ranks.n_unique() <= TIMELINE_MAX_LANES:
        expr = (pl.when(pl.col("rank").is_not_null())
                .then(pl.format("rank {}", pl.col("rank")))
                .when(pl.col("host").is_not_null()).then(pl.format("host {}", pl.col("host")))
                .otherwise(other))
        return expr, "per rank"
    if 0 < hosts.n_unique() <= TIMELINE_MAX_LANES:
        return pl.when(pl.col("host").is_not_null()).then(pl.col("host")).otherwise(other), \
            "per host"
    if ranks.len():
        block = max(1, math.ceil((int(ranks.max()) + 1) / TIMELINE_MAX_LANES))  # type: ignore[arg-type]
        lo = (pl.col("rank") // block) * block
        expr = (pl.when(pl.col("rank").is_not_null())
                .then(pl.format("ranks {}-{}", lo, lo + block - 1)).otherwise(other))
        return expr, f"per block of {block} ranks"
    return other, "all events"


def _lane_key(label: str) -> tuple[int, int, str]:
    m = re.match(r"ranks? (\d+)", label)
    if m:
        return (0, int(m.group(1)), label)
    return (2, 0, label) if label == "launcher / other" else (1, 0, label)


def _fmt_ts(ts: datetime, span: timedelta) -> str:
    if span < timedelta(seconds=10):
        return ts.strftime("%H:%M:%S.%f")[:-3]
    if span < timedelta(days=1):
        return ts.strftime("%H:%M:%S")
    return ts.strftime("%m-%d %H:%M")


def _timeline_view(analysis: Analysis) -> TimelineView | None:
    events = analysis.job.events
    if events.height == 0:
        return None
    ev = events.filter(pl.col("ts").is_not_null())
    if ev.height == 0:
        return None
    t0, t1 = ev["ts"].min(), ev["ts"].max()
    assert isinstance(t0, datetime) and isinstance(t1, datetime)
    span = max(t1 - t0, timedelta(milliseconds=1))
    lane, how = _lane_expr(ev)
    ev = ev.with_columns(
        lane.alias("_lane"),
        pl.col("kind").replace_strict(KIND_CATEGORY, default="other").alias("_cat"),
        ((pl.col("ts") - t0).dt.total_microseconds() / (span.total_seconds() * 1e6))
        .alias("_pos"),
    )
    buckets = 200
    while True:
        grouped = (
            ev.sort("ts")
            .with_columns((pl.col("_pos") * buckets).floor().clip(0, buckets - 1).alias("_b"))
            .group_by("_lane", "_b", "_cat")
            .agg(pl.len().alias("n"), pl.col("kind").first(), pl.col("ts").first(),
                 pl.col("text").first())
        )
        if grouped.height <= TIMELINE_MAX_MARKS or buckets <= 10:
            break
        buckets //= 2
    lanes = sorted(grouped["_lane"].unique().to_list(), key=_lane_key)
    plot = TL_WIDTH - TL_LEFT - TL_RIGHT
    flines: list[FindingLine] = []
    timed = sorted((f for f in analysis.findings[:12] if f.ts is not None and t0 <= f.ts <= t1),
                   key=lambda f: f.ts or t0)
    row, last_x = 0, -1e9
    for f in timed:
        x = TL_LEFT + (f.ts - t0) / span * plot  # type: ignore[operator]
        row = row + 1 if x - last_x < 26 and row < 3 else 0
        last_x = x
        flines.append(FindingLine(round(x, 1), 11 + row * 11, f.id,
                                  f"{f.id} {f.rule}: {clean(f.summary, 160)}",
                                  "end" if x > TL_WIDTH - TL_RIGHT - 30 else "start"))
    top = TL_TOP + (11 * max((int((fl.y - 11) / 11) for fl in flines), default=0))
    lane_y = {name: top + i * TL_LANE + TL_LANE / 2 for i, name in enumerate(lanes)}
    marks = []
    for name, b, cat, n, kind, ts, text in grouped.sort("_b").iter_rows():
        x = TL_LEFT + (b + 0.5) / buckets * plot
        count = f" ×{n}" if n > 1 else ""
        marks.append(Mark(round(x, 1), lane_y[name], cat,
                          f"{clean(name, 80)} · {ts.isoformat(sep=' ')} · {kind}{count}: "
                          f"{clean(text, 200)}"))
    if span >= timedelta(minutes=1):
        labels = [_fmt_ts(t0 + span * i / 5, span) for i in range(6)]
    else:  # short spans: the start, then offsets from it
        labels = [_fmt_ts(t0, span)] + [f"+{_span_text(span * i / 5)}" for i in range(1, 6)]
    ticks = [Tick(round(TL_LEFT + i / 5 * plot, 1), label) for i, label in enumerate(labels)]
    cats = dict(grouped.group_by("_cat").agg(pl.col("n").sum()).iter_rows())
    untimed = events.height - ev.height
    caption = (f"{ev.height:,} timestamped events {how}, {t0.isoformat(sep=' ')} → "
               f"{t1.isoformat(sep=' ')} ({_span_text(span)}); time axis in {buckets} bins.")
    if untimed:
        caption += f" {untimed:,} events without a timestamp are not shown."
    return TimelineView(
        width=TL_WIDTH, height=top + len(lanes) * TL_LANE + 28, left=TL_LEFT,
        right=TL_WIDTH - TL_RIGHT, lanes=[(lane_y[n], clean(n, 40)) for n in lanes],
        ticks=ticks, marks=marks, findings=flines,
        categories=[(c, int(cats.get(c, 0))) for c in CATEGORIES if cats.get(c)],
        caption=caption,
    )


def _span_text(span: timedelta) -> str:
    s = span.total_seconds()
    if s < 0.01:
        return f"{s * 1000:.2g} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


# --------------------------------------------------------------------------- environment

#: Variables that identify the process and so differ by design.
IDENTITY = re.compile(
    r"^(?:RANK|LOCAL_RANK|GROUP_RANK|ROLE_RANK|GLOBAL_RANK|HOSTNAME|HOST|"
    r"TORCHELASTIC_ERROR_FILE|OMPI_COMM_WORLD_(?:LOCAL_)?RANK|PMI_RANK|PMIX_RANK|"
    r"SLURM_(?:PROCID|LOCALID|NODEID|TASK_PID|TOPOLOGY_ADDR|STEP_NODELIST)|SLURMD_NODENAME|"
    r"_|OLDPWD|SHLVL|SSH_\w+|TERM_SESSION_ID|INVOCATION_ID|JOURNAL_STREAM)$"
)


@dataclass
class EnvValue:
    value: str
    who: str
    count: int


@dataclass
class EnvKey:
    key: str
    version: bool
    values: list[EnvValue]
    more: int


@dataclass
class EnvView:
    processes: int
    left_out: int  # processes with no rank (launcher agents...) when ranked ones exist
    differing: list[EnvKey]
    same_versions: list[tuple[str, str]]
    same_env: int  # variables identical everywhere: counted, not listed (a report is shared)
    identity: list[str]


def _env_value(key: str, value: str | None) -> str:
    if value is None:
        return "(unset)"
    if is_secret_name(key.removeprefix("version.")) and value != MASK:
        return MASK
    return clean(value, 300)


def _env_view(env: pl.DataFrame) -> EnvView | None:
    if env.height == 0:
        return None
    left_out = 0
    ranked = env.filter(pl.col("rank").is_not_null())
    if ranked.height:  # compare ranks with ranks; the launcher agent has another environment
        left_out = env.filter(pl.col("rank").is_null()).select("host", "pid").n_unique() \
            if ranked.height < env.height else 0
        env = ranked
    env = env.with_columns(
        pl.format("{}\x1f{}", pl.col("host").fill_null("?"), pl.col("pid").fill_null(-1))
        .alias("_proc"))
    procs = env.select("_proc", "rank", "pid").unique("_proc")
    n = procs.height
    label_of = {p: (r, pid) for p, r, pid in procs.iter_rows()}
    per_key = env.group_by("key").agg(pl.col("value").n_unique().alias("nv"),
                                      pl.col("_proc").n_unique().alias("np"))
    same = per_key.filter((pl.col("nv") == 1) & (pl.col("np") == n))["key"].to_list()
    diff_keys = per_key.filter((pl.col("nv") > 1) | (pl.col("np") < n))["key"].to_list()
    first = env.unique("key", keep="first").select("key", "value")
    same_vals = dict(first.filter(pl.col("key").is_in(same)).iter_rows())
    identity = sorted(k for k in diff_keys if IDENTITY.match(k))
    differing: list[EnvKey] = []
    rows = (env.filter(pl.col("key").is_in([k for k in diff_keys if k not in identity]))
            .group_by("key", "value").agg(pl.col("_proc").unique()))
    by_key: dict[str, list[tuple[str | None, list[str]]]] = defaultdict(list)
    for key, value, plist in rows.iter_rows():
        by_key[key].append((value, plist))
    for key in sorted(by_key, key=lambda k: (not k.startswith("version."), k)):
        entries = by_key[key]
        covered = {p for _, pl_ in entries for p in pl_}
        missing = [p for p in label_of if p not in covered]
        if missing:
            entries.append((None, missing))
        entries.sort(key=lambda e: -len(e[1]))
        values = []
        for value, plist in entries[:MAX_ENV_VALUES]:
            values.append(EnvValue(_env_value(key, value), _procs_label(plist, label_of),
                                   len(plist)))
        differing.append(EnvKey(clean(key, 120), key.startswith("version."), values,
                                max(0, len(entries) - MAX_ENV_VALUES)))
    same_versions = sorted((clean(k, 120), _env_value(k, v)) for k, v in same_vals.items()
                           if k.startswith("version."))
    same_env = sum(not k.startswith("version.") for k in same_vals)
    return EnvView(processes=n, left_out=left_out, differing=differing, same_versions=same_versions,
                   same_env=same_env, identity=[clean(k, 80) for k in identity])


def _procs_label(plist: Iterable[str], label_of: dict[str, tuple[int | None, int | None]]) -> str:
    ranks, pids = [], []
    for p in plist:
        r, pid = label_of.get(p, (None, None))
        if r is not None:
            ranks.append(r)
        elif pid is not None:
            pids.append(pid)
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(set(ranks)) > 1 else ''} {short_ranks(ranks, 8)}")
    if pids:
        parts.append(f"pid{'s' if len(pids) > 1 else ''} {','.join(map(str, sorted(pids)[:6]))}"
                     + ("…" if len(pids) > 6 else ""))
    return ", ".join(parts) or "?"


# --------------------------------------------------------------------------- inputs, collection


@dataclass
class InputsView:
    rows: list[dict[str, Any]]
    more: int
    by_kind: list[tuple[str, int]]
    notes: list[dict[str, str]]
    not_evaluated: list[dict[str, str]]
    errored: list[dict[str, str]]
    ruled_out: list[dict[str, str]]
    fired: list[dict[str, str]]


def _inputs_view(analysis: Analysis) -> InputsView:
    job = analysis.job
    rows = [{"path": clean(i.path, 300), "kind": i.kind, "lines": i.lines, "bytes": i.bytes,
             "events": i.events} for i in job.inputs[:MAX_INPUT_ROWS]]
    kinds = Counter(i.kind for i in job.inputs)

    def rule_row(code: str, slug: str, **extra: str) -> dict[str, str]:
        rule = get_rule(code)
        return {"rule": code, "slug": slug, "title": rule.title() if rule else "", **extra}

    not_eval, errored, ruled_out, fired = [], [], [], []
    for o in analysis.outcomes:
        if o.status == "not_evaluated":
            not_eval.append(rule_row(o.rule, o.slug, missing=", ".join(o.missing)))
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


def _bundle_views(job: Any) -> list[BundleView]:
    out = []
    for b in job.bundles:
        man = b.manifest if isinstance(b.manifest, dict) else {}
        tool = man.get("tool") if isinstance(man.get("tool"), dict) else {}
        facts = [("host", man.get("host")), ("created", man.get("created")),
                 ("complete", man.get("complete")), ("duration", man.get("duration_s")),
                 ("deadline", man.get("deadline_s")), ("step timeout", man.get("step_timeout_s")),
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


# --------------------------------------------------------------------------- collectives


@dataclass
class CollGroupView:
    """One process group's collective timeline (Flight Recorder), ranks grouped by state."""

    anchor: str
    title: str
    facts: list[tuple[str, str]]
    rows: list[dict[str, str]]
    more: int


def _collectives_views(analysis: Analysis) -> list[CollGroupView]:
    """Only when Flight Recorder dumps were read (see analyzer/collectives.py)."""
    coll = getattr(analysis.job, "collectives", None)
    if not isinstance(coll, pl.DataFrame) or coll.height == 0:
        return []
    from ddp_autopsy.analyzer import collectives

    views = []
    for i, g in enumerate(collectives.analyze(analysis.job).groups[:16]):
        facts = [("members", f"{len(g.members):,} ({g.members_from})")]
        if g.stuck_at is not None:
            call = g.stuck_call
            facts.append(("stuck at", f"#{g.stuck_at}" + (f" {call.shape}" if call else "")))
            if call and call.site:
                facts.append(("called from", call.site))
        if g.waiting:
            facts.append(("waiting", collectives.rank_list(g.waiting)))
        if g.not_joined:
            facts.append(("never joined", collectives.rank_list(g.not_joined)))
        if g.no_dump:
            facts.append(("no usable dump", collectives.rank_list(g.no_dump)))
        if g.divergence:
            d = g.divergence
            facts.append(("first divergence", f"#{d.seq} ({d.aspect}): "
                          f"{collectives.rank_list(d.culprits)}"))
        if g.laggards:
            facts.append(("laggards", collectives.rank_list(g.laggards)))
        rows, more = g.state_rows()
        views.append(CollGroupView(anchor=f"pg{i}", title=clean(g.label, 200),
                                   facts=[(k, clean(v, 300)) for k, v in facts],
                                   rows=[{k: clean(v, 300) for k, v in r.items()} for r in rows],
                                   more=more))
    return views


# --------------------------------------------------------------------------- the page


@dataclass
class Page:
    title: str
    generated: str
    version: str
    headline: str
    facts: list[tuple[str, str]]
    verdict: FindingView | None
    findings: list[FindingView]
    no_failure: bool
    trees: list[TreeView]
    has_stacks: bool
    grid: GridView | None
    timeline: TimelineView | None
    env: EnvView | None
    inputs: InputsView
    bundles: list[BundleView]
    bundles_more: int
    elapsed: str
    csp: str
    script: Markup
    data: Markup
    collectives: list[CollGroupView] = field(default_factory=list)


def _facts(analysis: Analysis, tree: StackTree) -> list[tuple[str, str]]:
    job = analysis.job
    logs = [i for i in job.inputs if i.kind == "log"]
    facts = [("log files", f"{len(logs):,}"), ("lines", f"{sum(i.lines for i in logs):,}"),
             ("events", f"{job.events.height:,}")]
    if job.stacks.height:
        facts.append(("stack dumps", f"{job.stacks.select('source').n_unique():,}"))
    if job.bundles:
        facts.append(("bundles", f"{len(job.bundles):,}"))
    if job.world_size:
        facts.append(("world size", f"{job.world_size:,}"))
    if job.ranks.height:
        facts.append(("ranks seen", f"{job.ranks.height:,}"))
    facts.append(("findings", f"{len(analysis.findings)}"))
    return facts


@cache
def _env() -> Environment:
    return Environment(
        loader=PackageLoader("ddp_autopsy.reports", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@cache
def _script() -> tuple[str, str]:
    """The report's script and its CSP hash."""
    loader = _env().loader
    assert loader is not None
    source, _, _ = loader.get_source(_env(), "report.js")
    digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
    return source, f"'sha256-{digest}'"


def page(analysis: Analysis, tree: StackTree | None = None,
         now: datetime | None = None) -> Page:
    """The view model of the report (everything the template shows, already cleaned)."""
    job = analysis.job
    tree = tree if tree is not None else job.stack_tree
    reader = _ContextReader(job)
    reader.prefetch(ev for f in analysis.findings for ev in f.evidence)
    findings = [_finding_view(f, reader) for f in analysis.findings]
    verdict = next((v for v, f in zip(findings, analysis.findings, strict=True)
                    if f is analysis.verdict), None)
    trees = []
    if job.stacks.height:
        trees.append(_tree_view(tree, "", "Main threads"))
        if tree.threads is not None and len(tree.threads.procs):
            trees.append(_tree_view(tree.threads, "t-", "Other threads that run or hold the GIL",
                                    "thread"))
        for role, side in tree.side.items():
            trees.append(_tree_view(side, f"{role}-", f"{role.capitalize()} processes"))
    script, digest = _script()
    csp = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
           f"script-src {digest}; base-uri 'none'; form-action 'none'")
    headline = verdict.summary if verdict else "No root cause found"
    when = now or datetime.now().astimezone()
    bundles = _bundle_views(job)
    return Page(
        title=f"ddp-autopsy: {clean(headline, 120)}",
        generated=when.isoformat(sep=" ", timespec="seconds"),
        version=__version__, headline=headline, facts=_facts(analysis, tree),
        verdict=verdict, findings=findings,
        no_failure=not analysis.findings, trees=trees, has_stacks=bool(job.stacks.height),
        grid=_grid_view(analysis), timeline=_timeline_view(analysis),
        env=_env_view(job.env), inputs=_inputs_view(analysis), bundles=bundles[:64],
        bundles_more=max(0, len(bundles) - 64), elapsed=f"{job.elapsed_s:.2f} s",
        csp=csp, script=Markup(script),
        data=script_json(redact_obj(json_report.to_dict(analysis))),
        collectives=_collectives_views(analysis),
    )


def render(analysis: Analysis, *, tree: StackTree | None = None,
           now: datetime | None = None) -> str:
    """The report as one HTML string."""
    return _env().get_template("report.html.j2").render(p=page(analysis, tree, now),
                                                        states=STATES)
