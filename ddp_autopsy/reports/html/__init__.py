"""The HTML post-mortem: one self-contained, shareable file (``ddp-autopsy report -o FILE``).

The page is built in two steps: this package turns an :class:`Analysis` into plain view objects
(every log-derived string redacted and truncated here), then ``templates/report.html.j2`` renders
them with Jinja autoescaping on. CSS, JS and SVG are inline; a Content-Security-Policy allows no
network access at all and only the report's own script (by hash). Everything is readable with
JavaScript off; the script only adds filtering, a theme switch and print helpers.

One module per section builds its view objects: ``findings`` (the verdict and findings, evidence
lines in context, anchors ``#F1``, ``#F1-e1``), ``stacks`` (the merged stacks of
:mod:`ddp_autopsy.analyzer.stacktree`), ``grid`` (rank states), ``timeline`` (SVG),
``environment`` (versions and environment, only what differs), ``inputs`` (what was read and not
examined, collection metadata) and ``collectives``; ``common`` holds the text helpers and bounds;
this module assembles the page. The analysis JSON
(``ddp-autopsy/analysis/1``) is embedded as ``<script type="application/json"
id="ddp-autopsy-analysis">``, its per-rank lists stored by column (``columns``: lossless;
:func:`embedded_analysis` reads it back as analysis/1). See docs/report.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from ddp_autopsy import __version__
from ddp_autopsy.analyzer.stacktree import StackTree
from ddp_autopsy.redact import redact_obj
from ddp_autopsy.reports import json_report
from ddp_autopsy.reports.html.collectives import CollGroupView, collectives_views
from ddp_autopsy.reports.html.columns import compact, expand
from ddp_autopsy.reports.html.common import TIMELINE_MAX_MARKS, clean, script_json
from ddp_autopsy.reports.html.environment import EnvView, env_view
from ddp_autopsy.reports.html.findings import ContextReader, FindingView, finding_view
from ddp_autopsy.reports.html.grid import STATES, GridView, grid_view, rank_states
from ddp_autopsy.reports.html.inputs import BundleView, InputsView, bundle_views, inputs_view
from ddp_autopsy.reports.html.ranks import RankTableView, rank_table_view
from ddp_autopsy.reports.html.stacks import TreeView, tree_view
from ddp_autopsy.reports.html.timeline import CATEGORY_LABEL, TimelineView, timeline_view
from ddp_autopsy.rules.engine import Analysis

__all__ = ["STATES", "TIMELINE_MAX_MARKS", "Page", "clean", "embedded_analysis", "expand", "page",
           "rank_states", "render", "script_json"]


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
    ranks: RankTableView | None = None
    #: Sections left out for want of input: (what, how to get it), said in one line.
    absent: list[tuple[str, str]] = field(default_factory=list)


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
    reader = ContextReader(job)
    reader.prefetch(ev for f in analysis.findings for ev in f.evidence)
    findings = [finding_view(f, reader) for f in analysis.findings]
    verdict = next((v for v, f in zip(findings, analysis.findings, strict=True)
                    if f is analysis.verdict), None)
    trees = []
    if job.stacks.height:
        trees.append(tree_view(tree, "", "Main threads"))
        if tree.threads is not None and len(tree.threads.procs):
            trees.append(tree_view(tree.threads, "t-", "Other threads that run or hold the GIL",
                                    "thread"))
        for role, side in tree.side.items():
            trees.append(tree_view(side, f"{role}-", f"{role.capitalize()} processes"))
    script, digest = _script()
    csp = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
           f"script-src {digest}; base-uri 'none'; form-action 'none'")
    headline = verdict.summary if verdict else "No root cause found"
    when = now or datetime.now().astimezone()
    bundles = bundle_views(job)
    timeline = timeline_view(analysis)
    env = env_view(job.env)
    absent = []
    if not job.stacks.height:
        absent.append(("stack dumps", "run ddp-autopsy collect while the job hangs: py-spy "
                       "shows where every rank is"))
    if timeline is None:
        absent.append(("a timeline", "fewer than two timestamped moments"))
    if env is None:
        absent.append(("versions and environment", "ddp-autopsy collect bundles hold them"))
    return Page(
        title=f"ddp-autopsy: {clean(headline, 120)}",
        generated=when.isoformat(sep=" ", timespec="seconds"),
        version=__version__, headline=headline, facts=_facts(analysis, tree),
        verdict=verdict, findings=findings,
        no_failure=not analysis.findings, trees=trees, has_stacks=bool(job.stacks.height),
        grid=grid_view(analysis), timeline=timeline,
        env=env, inputs=inputs_view(analysis), bundles=bundles[:64],
        bundles_more=max(0, len(bundles) - 64), elapsed=f"{job.elapsed_s:.2f} s",
        csp=csp, script=Markup(script),
        data=script_json(compact(redact_obj(json_report.to_dict(analysis)))),
        collectives=collectives_views(analysis), ranks=rank_table_view(analysis),
        absent=absent,
    )


def render(analysis: Analysis, *, tree: StackTree | None = None,
           now: datetime | None = None) -> str:
    """The report as one HTML string."""
    return _env().get_template("report.html.j2").render(p=page(analysis, tree, now),
                                                        states=STATES,
                                                        cat_labels=CATEGORY_LABEL)


EMBEDDED = re.compile(r'<script type="application/json" id="ddp-autopsy-analysis">(.*?)</script>',
                      re.S)


def embedded_analysis(doc: str) -> dict[str, Any]:
    """The analysis a report embeds, in the ``ddp-autopsy/analysis/1`` form (docs/json.md)."""
    m = EMBEDDED.search(doc)
    if m is None:
        raise ValueError("no embedded analysis (#ddp-autopsy-analysis) in this document")
    return expand(json.loads(m.group(1)))
