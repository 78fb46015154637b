"""The terminal report: the verdict first, then the other findings, then what was not examined.

Log text is printed as plain text (never as rich markup) and evidence lines are not wrapped.
Everything that comes from the inputs (log lines, file names, hosts, rule summaries quoting them)
passes through :func:`termsafe`: control characters are shown escaped, never sent.
"""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.text import Text

from ddp_autopsy.reports import wording
from ddp_autopsy.reports.termsafe import termsafe
from ddp_autopsy.rules.base import Finding
from ddp_autopsy.rules.engine import Analysis


def _who(f: Finding) -> str:
    return termsafe(wording.who(f))


def _evidence(console: Console, f: Finding, indent: str, limit: int = 3) -> None:
    for ev in f.evidence[:limit]:
        line = Text(indent)
        line.append(termsafe(ev.location), style="cyan")
        line.append("  ")
        line.append(termsafe(ev.text.strip()))
        console.print(line, soft_wrap=True)


def make_console(out: TextIO | None = None, color: bool | None = None) -> Console:
    """The console for a report: ``color`` True (``--color``) forces colours even into a pipe
    or under NO_COLOR; False (``--no-color``) never; None lets rich decide (colour on a
    terminal, none when the NO_COLOR environment variable is set or output is piped)."""
    return Console(file=out, highlight=False, no_color=None if color is None else not color,
                   force_terminal=True if color else None)


def render(analysis: Analysis, out: TextIO | None = None, color: bool | None = None,
           redact: bool = False) -> None:
    """Print the report; ``redact`` masks secrets in what the job's own lines show (the
    findings of a redacted analysis are masked already)."""
    console = make_console(out, color)
    job = analysis.job
    logs = [i for i in job.inputs if i.kind == "log"]
    n_lines = sum(i.lines for i in logs)
    stacked = job.stacks.select("source").n_unique() if job.stacks.height else 0
    head = (f"ddp-autopsy: {len(logs)} log file(s), {n_lines:,} lines, {job.events.height:,} "
            f"events, {stacked} stack dump(s)")
    if job.world_size:
        head += f", world size {job.world_size}"
    console.print(Text(head + f"  ({job.elapsed_s:.2f} s)", style="dim"), soft_wrap=True)
    console.print()

    verdict = analysis.verdict
    if verdict is None:
        console.print(Text("No root cause found.", style="bold"), soft_wrap=True)
        if not analysis.findings:
            console.print("Nothing in the inputs looks like a failure.", soft_wrap=True)
    else:
        line = Text("VERDICT  ", style="bold red")
        line.append(termsafe(verdict.summary), style="bold")
        console.print(line, soft_wrap=True)
        meta = Text(termsafe(f"         {verdict.cause} ({verdict.rule} {verdict.slug})"),
                    style="dim")
        who = _who(verdict)
        if who:
            meta.append(f" · {who}")
        console.print(meta, soft_wrap=True)
        _evidence(console, verdict, "         ")
        console.print(Text("         remedy: ", style="green").append(termsafe(verdict.remedy)),
                      soft_wrap=True)

    others = [f for f in analysis.findings if f is not verdict]
    if others:
        console.print()
        console.print(Text("Other findings", style="bold"))
        for f in others:
            label = wording.role_label(f)
            line = Text(f"  {f.id} ")
            line.append(f"[{label}] ", style="yellow" if f.role == "symptom" else "magenta")
            line.append(termsafe(f.summary))
            line.append(f"  ({f.rule} {f.slug})", style="dim")
            console.print(line, soft_wrap=True)
            _evidence(console, f, "       ", limit=1)

    _ranks(console, analysis, redact=redact)
    if job.snapshot_moves:
        from ddp_autopsy.analyzer.snapshots import summary

        console.print(Text(termsafe(f"Between stack snapshots: {summary(job.snapshot_moves)}"),
                           style="dim"), soft_wrap=True)

    if job.stacks.height:
        from ddp_autopsy.reports import stacks_text

        console.print()
        stacks_text.render(console, job.stack_tree)

    skipped = [o for o in analysis.outcomes if o.status in ("not_evaluated", "errored")]
    if job.notes or skipped:
        console.print()
        console.print(Text("Not examined", style="bold"))
        for note in job.notes:
            console.print(Text(termsafe(f"  {note.path}: {note.message}")), soft_wrap=True)
        # Rules that stopped for the same reason share one line (four Flight Recorder rules, one
        # hint on how to get dumps).
        reasons: dict[str, list[str]] = {}
        for o in skipped:
            reasons.setdefault(wording.not_examined(o), []).append(o.rule)
        for why, codes in reasons.items():
            msg = f"  {', '.join(codes)}: {why}"
            console.print(Text(termsafe(msg), style="dim"), soft_wrap=True)


def _ranks(console: Console, analysis: Analysis, limit: int = 12, redact: bool = False) -> None:
    """The per-rank table, ranks that share a row collapsed into ranges."""
    from ddp_autopsy.redact import redact_text
    from ddp_autopsy.reports.ranktable import groups

    shown = redact_text if redact else str

    table = analysis.job.rank_state
    if table.height == 0:
        return
    verdict = analysis.verdict
    rows = groups(table, culprits=verdict.ranks if verdict else ())
    world = analysis.job.world_size
    console.print()
    console.print(Text(f"Ranks ({table.height:,}" + (f" of world size {world:,})" if world
                                                     else ")"), style="bold"))
    labels = [f"{'rank' if g.count == 1 else 'ranks'} {g.ranks}" for g in rows[:limit]]
    width = min(32, max(map(len, labels)) + 2)
    for g, label in zip(rows[:limit], labels, strict=False):
        line = Text("  ")
        line.append(termsafe(label).ljust(width), style="bold red" if g.culprit else "")
        line.append(f"{g.state:8s}", style="red" if g.culprit else "dim")
        line.append(termsafe(f"  {shown(g.doing)}" if g.doing else ""))
        if g.host:
            line.append(termsafe(f"  on {g.host}"), style="dim")
        if g.last_line:
            last = " ".join(shown(g.last_line).split())[:100]
            line.append(termsafe(f"  last: {last}"), style="dim")
        console.print(line, soft_wrap=True)
    if len(rows) > limit:
        console.print(Text(f"  … {len(rows) - limit} more rows (--format json has them all)",
                           style="dim"))
