"""The Python API (docs/api.md): what ``ddp-autopsy analyze`` and ``collect`` do, as calls.

>>> import ddp_autopsy
>>> a = ddp_autopsy.analyze(["logs/"])          # doctest: +SKIP
>>> a.verdict.cause, a.verdict.ranks             # doctest: +SKIP
('rank_stuck_outside_collective', [2])

``import ddp_autopsy`` stays light: this module (and polars with it) loads on first use of
``ddp_autopsy.analyze`` / ``collect`` / ``Analysis``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from ddp_autopsy.analyzer.job import Job
    from ddp_autopsy.collectors.collect import CollectResult
    from ddp_autopsy.rules.base import Finding, Outcome
    from ddp_autopsy.rules.engine import Analysis as _EngineAnalysis

__all__ = ["Analysis", "AnalysisError", "analyze", "collect"]

PathLike = str | os.PathLike[str]


class AnalysisError(Exception):
    """Nothing in the given paths could be read (the CLI's exit code 3); ``notes`` says why."""

    def __init__(self, message: str, notes: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.notes = list(notes)


@dataclass(frozen=True)
class Analysis:
    """The result of :func:`analyze`: the verdict, every finding, the per-rank table.

    ``engine`` is the analysis the CLI renders (``ddp_autopsy.rules.engine.Analysis``) and
    ``job`` the parsed inputs (its frames: ``job.events``, ``job.stacks``...; docs/frames.md).
    """

    engine: _EngineAnalysis
    #: Made with ``analyze(..., redact=True)``: every output masks secrets.
    redacted: bool = False

    @property
    def job(self) -> Job:
        return self.engine.job

    @property
    def verdict(self) -> Finding | None:
        """The top root cause (``.cause``, ``.ranks``, ``.summary``, ``.evidence``,
        ``.remedy``), or None when nothing explains a failure."""
        return self.engine.verdict

    @property
    def findings(self) -> list[Finding]:
        """Root causes first (most certain first), then symptoms, then info."""
        return list(self.engine.findings)

    @property
    def outcomes(self) -> list[Outcome]:
        """How each rule ended: ``finding``, ``ruled_out``, ``not_evaluated``, ``errored``."""
        return list(self.engine.outcomes)

    @property
    def ranks(self) -> pl.DataFrame:
        """The per-rank table (``job.rank_state``): rank, host, pid, state, frame, collective,
        seq, last_line... one row per rank of the world size (docs/json.md ``ranks.table``),
        plus ``culprit`` (the verdict names it)."""
        import polars as pl

        culprits = sorted(set(self.verdict.ranks)) if self.verdict else []
        table = self.job.rank_state.with_columns(
            pl.col("rank").is_in(culprits).alias("culprit"))
        if self.redacted:  # the job's own last lines, masked as the JSON's ranks.table is
            from ddp_autopsy.redact import redact_text

            table = table.with_columns(pl.col("last_line").map_elements(
                redact_text, return_dtype=pl.String))
        return table

    def to_dict(self) -> dict[str, Any]:
        """The ``ddp-autopsy/analysis/1`` document as a dict (docs/json.md)."""
        import json

        return json.loads(self.to_json())

    def to_json(self, *, redact: bool = False) -> str:
        """``ddp-autopsy analyze --format json``; ``redact`` masks secrets as ``--redact``
        (always, for an analysis made with ``redact=True``)."""
        from ddp_autopsy.reports import json_report

        engine = self.engine
        redact = redact or self.redacted
        if redact and not self.redacted:
            from ddp_autopsy.redact import redact_analysis

            engine = redact_analysis(engine)
        return json_report.render(engine, redact=redact)

    def to_html(self, path: PathLike | None = None) -> str:
        """The self-contained HTML post-mortem (always redacted); also written to ``path``."""
        from ddp_autopsy.reports import html

        page = html.render(self.engine)
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page

    def to_sarif(self) -> dict[str, Any]:
        """The SARIF 2.1.0 log of the findings (docs/ci.md)."""
        from ddp_autopsy.reports import ci_formats

        return ci_formats.sarif(self.engine)

    def to_text(self, *, color: bool = False) -> str:
        """The terminal report as a string."""
        import io

        from ddp_autopsy.reports import text

        buf = io.StringIO()
        text.render(self.engine, out=buf, color=color, redact=self.redacted)
        return buf.getvalue()

    def _repr_html_(self) -> str:
        """A notebook's display: the verdict, its evidence, and the per-rank table."""
        from html import escape

        v = self.verdict
        if v is None:
            head = "<b>No root cause found.</b>"
        else:
            ev = "".join(f"<li><code>{escape(e.location)}</code> {escape(e.text.strip())}</li>"
                         for e in v.evidence[:5])
            head = (f"<b>VERDICT</b> {escape(v.summary)}<br><small>{escape(str(v.cause))} "
                    f"({escape(v.rule)} {escape(v.slug)})</small><ul>{ev}</ul>"
                    f"<i>remedy:</i> {escape(v.remedy)}")
        others = "".join(f"<li>[{escape(f.role)}] {escape(f.summary)} "
                         f"<small>({escape(f.rule)})</small></li>"
                         for f in self.findings if f is not v)
        table = self.ranks.select(
            [c for c in ("rank", "host", "state", "frame", "collective", "last_line", "culprit")
             if c in self.job.rank_state.columns or c == "culprit"]).head(64)
        return (f"<div class='ddp-autopsy'>{head}"
                + (f"<p><b>Other findings</b></p><ul>{others}</ul>" if others else "")
                + table._repr_html_() + "</div>")

    def __repr__(self) -> str:
        v = self.verdict
        said = f"{v.cause} ({v.rule}), ranks {v.ranks}" if v else "no root cause"
        return f"<ddp_autopsy.Analysis: {said}; {len(self.findings)} finding(s)>"


def analyze(paths: PathLike | Iterable[PathLike], *, raw_logs: bool = False,
            redact: bool = False, config: PathLike | bool | None = None) -> Analysis:
    """Analyze logs, log directories, archives or collect bundles of one job, as
    ``ddp-autopsy analyze`` does.

    ``paths``: one path or several (analyzed together as one job). ``raw_logs``: re-read
    bundles' raw logs instead of collect's summaries. ``redact``: mask secrets in the findings.
    ``config``: a configuration file (docs/config.md); None finds one from the current
    directory as the CLI does, False uses none.
    Raises :class:`AnalysisError` when nothing could be read, :class:`TypeError` for an empty
    ``paths``, ``ddp_autopsy.config.ConfigError`` for an unusable configuration.
    """
    from ddp_autopsy import config as configuration
    from ddp_autopsy.analyzer.job import load
    from ddp_autopsy.rules.engine import registry, run

    if config is True:
        config = None
    conf = configuration.load(Path(config) if config not in (None, False) else None,
                              discover=config is not False)
    rules = conf.rules(registry())

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    chosen = [Path(p) for p in paths]
    if not chosen:
        raise TypeError("analyze() needs at least one path")
    with conf.installed():  # extra log patterns (process-wide: see ddp_autopsy.config)
        job = load(chosen, use_summaries=not raw_logs)
        if not job.readable:
            reasons = "; ".join(f"{n.path}: {n.message}" for n in job.notes)
            raise AnalysisError(f"nothing readable in the given paths ({reasons})", job.notes)
        engine = run(job, rules)
    conf.apply(engine.findings)
    if redact:
        from ddp_autopsy.redact import redact_analysis

        engine = redact_analysis(engine)
    return Analysis(engine, redacted=redact)


def collect(*, pid: int | None = None, job: str | None = None,
            out: PathLike | None = None, logs: Iterable[PathLike] = (),
            native: bool = False, deadline: float = 60.0, step_timeout: float = 10.0,
            tar: bool = False) -> CollectResult:
    """Snapshot a running distributed job on this host into a bundle, as ``ddp-autopsy
    collect`` does; returns the result (``.bundle``, ``.manifest``, ``.warnings``,
    ``.tarball``). Pass the bundle to :func:`analyze`.

    Raises ``ddp_autopsy.collectors.jobs.CollectError`` when there is no such job (or several
    and none chosen) or ``out`` is not empty.
    """
    from ddp_autopsy.collectors.collect import CollectOptions
    from ddp_autopsy.collectors.collect import collect as run_collect

    opts = CollectOptions(pid=pid, job=job, out=Path(out) if out is not None else None,
                          logs=[Path(p) for p in logs], deadline_s=deadline,
                          step_timeout_s=step_timeout, native=native, tar=tar)
    return run_collect(opts)
