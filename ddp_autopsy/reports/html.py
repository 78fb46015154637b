"""Placeholder until the HTML post-mortem lands: a minimal, escaped page."""

from __future__ import annotations

from jinja2 import Environment

from ddp_autopsy.rules.engine import Analysis

_TEMPLATE = """<!doctype html><meta charset="utf-8"><title>ddp-autopsy</title>
<h1>{{ verdict.summary if verdict else "No root cause found" }}</h1>
{% for f in findings %}<h2 id="{{ f.id }}">{{ f.id }} {{ f.rule }} {{ f.summary }}</h2>
<pre>{% for e in f.evidence %}{{ e.location }}  {{ e.text }}
{% endfor %}</pre>{% endfor %}"""


def render(analysis: Analysis) -> str:
    env = Environment(autoescape=True)
    return env.from_string(_TEMPLATE).render(verdict=analysis.verdict, findings=analysis.findings)
