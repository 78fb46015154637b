"""Text helpers and bounds shared by the report's sections."""

from __future__ import annotations

import json
import re
from typing import Any

from markupsafe import Markup, escape

from ddp_autopsy.redact import redact_text

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
TIMELINE_MAX_MARKS = 1500  # marks drawn (each zoom step moves every one)
CODE_NOWRAP = 32  # characters: shorter code spans do not wrap


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
    """Escaped text with ```code``` spans as ``<code>``; short spans never break inside
    (``--master-port``); long ones break only between their words (each word short enough
    kept whole), a very long word anywhere.

    >>> str(code_spans("run `dist.barrier()` <now>"))
    'run <code class="nw">dist.barrier()</code> &lt;now&gt;'
    >>> str(code_spans("`torchrun --master-port <a free port, not 29284>`"))[:71]
    '<code><span class="nw">torchrun</span> <span class="nw">--master-port</'
    """
    def span(m: re.Match[str]) -> str:
        body = m.group(1)
        if len(body) <= CODE_NOWRAP:
            return f'<code class="nw">{body}</code>'
        words = re.split(r"( +)", body)
        return "<code>" + "".join(
            f'<span class="nw">{w}</span>' if w.strip() and len(w) <= CODE_NOWRAP else w
            for w in words) + "</code>"

    return Markup(re.sub(r"`([^`]+)`", span, str(escape(text))))


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
