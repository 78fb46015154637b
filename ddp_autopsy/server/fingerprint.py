"""The failure fingerprint that groups repeats of one failure (versioned: ``VERSION``).

A fingerprint is (cause, rule, template): the template is the verdict's culprit frame when the
rule names one, else its first evidence line (or summary), with numbers, addresses, hosts and
ranks masked. The cause is part of the hash, so different causes are never merged. Changing
what goes into a template bumps ``VERSION``: old groups keep their id, new analyses group anew.

>>> mask("rank 3 on node017: timeout after 600000 ms at 0x7f3a9c", hosts=["node017"])
'rank <n> on <host>: timeout after <n> ms at <addr>'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

VERSION = 1

_ADDR = re.compile(r"\b0x[0-9a-fA-F]+\b")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
_HEX = re.compile(r"\b[0-9a-f]{12,}\b", re.I)
_NUM = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_RANKS = re.compile(r"<n>(?:\s*(?:,|-|and)\s*<n>)+")
_SPACE = re.compile(r"\s+")


def mask(text: str, hosts: Iterable[str] = ()) -> str:
    """``text`` with addresses, ids, IPs, the given host names and numbers masked."""
    out = text
    for host in sorted({h for h in hosts if h}, key=len, reverse=True):
        out = out.replace(host, "<host>")
    out = _UUID.sub("<id>", out)
    out = _ADDR.sub("<addr>", out)
    out = _IP.sub("<ip>", out)
    out = _HEX.sub("<id>", out)
    out = _NUM.sub("<n>", out)
    out = _RANKS.sub("<n>", out)  # "ranks 1, 2" and "ranks 1-3" alike
    return _SPACE.sub(" ", out).strip()[:500]


@dataclass(frozen=True)
class Fingerprint:
    id: str
    version: int
    cause: str
    rule: str
    template: str
    #: The unmasked text the template came from (shown to say why incidents were grouped).
    raw: str


def of(verdict: dict[str, Any] | None) -> Fingerprint:
    """The fingerprint of a JSON verdict (``json_report.to_dict(...)['verdict']``)."""
    if not verdict:
        cause, rule, raw, template = "none", "-", "no failure found", "no failure found"
    else:
        cause = verdict.get("cause") or "unknown"
        rule = verdict.get("rule") or "-"
        hosts = verdict.get("hosts") or []
        details = verdict.get("details") or {}
        frame = details.get("frame")
        evidence = verdict.get("evidence") or []
        if frame:
            raw = f"{frame} ({details.get('file') or '?'})" if details.get("file") else str(frame)
            template = "frame: " + mask(str(frame), hosts)
            if details.get("file"):
                template += " in " + mask(str(details["file"]).rsplit("/", 1)[-1], hosts)
        elif evidence:
            raw = str(evidence[0].get("text", ""))
            template = "line: " + mask(raw, hosts)
        else:
            raw = str(verdict.get("summary", ""))
            template = "summary: " + mask(raw, hosts)
    digest = hashlib.sha256(f"v{VERSION}\x00{cause}\x00{rule}\x00{template}".encode())
    return Fingerprint(id=digest.hexdigest()[:24], version=VERSION, cause=cause, rule=rule,
                       template=template, raw=raw[:1000])
