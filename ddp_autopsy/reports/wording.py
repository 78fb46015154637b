"""Wording the terminal, JSON and HTML reports share: roles, who a finding is about, what was not
examined. Rank sets are phrased by :mod:`ddp_autopsy.analyzer.ranksets` (long sets elided).

>>> from ddp_autopsy.rules.base import Finding
>>> f = Finding("SYM001", "collective-timeout", None, "symptom", "warning", "s", "r",
...             ranks=list(range(0, 64, 2)), hosts=["node1", "node2"], explained_by="F1")
>>> role_label(f)
'symptom of F1'
>>> who(f)
'ranks 0,2,4,6,8,10,12,…,62 (32 ranks) · hosts node1, node2'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ddp_autopsy.analyzer.ranksets import short_ranks
from ddp_autopsy.rules.base import Finding, Outcome

ROLE_LABEL = {"root_cause": "root cause", "symptom": "symptom", "info": "info"}
#: Hosts named before the rest are counted.
HOSTS_SHOWN = 6


def role_label(f: Finding) -> str:
    """``root cause`` / ``symptom of F1`` / ``info``."""
    if f.role == "symptom" and f.explained_by:
        return f"symptom of {f.explained_by}"
    return ROLE_LABEL.get(f.role, f.role)


def who_of(ranks: Sequence[int], hosts: Sequence[str],
           clean: Callable[[str], str] = str) -> str:
    """``ranks 0-3 · hosts node1, node2`` (``clean`` makes a host name safe to show)."""
    parts = []
    rs, hs = sorted(set(ranks)), sorted(set(hosts))
    if rs:
        parts.append(f"rank{'s' if len(rs) > 1 else ''} {short_ranks(rs)}")
    if hs:
        more = f" +{len(hs) - HOSTS_SHOWN}" if len(hs) > HOSTS_SHOWN else ""
        parts.append(f"host{'s' if len(hs) > 1 else ''} "
                     f"{', '.join(clean(h) for h in hs[:HOSTS_SHOWN])}{more}")
    return " · ".join(parts)


def who(f: Finding, clean: Callable[[str], str] = str) -> str:
    return who_of(f.ranks, f.hosts, clean)


#: What a rule's missing input is, in the user's words, and how to get it next time.
MISSING: dict[str, tuple[str, str]] = {
    "collectives": ("Flight Recorder dumps",
                    "set TORCH_FR_BUFFER_SIZE=2000 and TORCH_FR_DUMP_ON_TIMEOUT=1 in the job's "
                    "environment and pass the dumps (TORCH_FR_DUMP_TEMP_FILE*), or run "
                    "`ddp-autopsy collect` while it hangs"),
    "stacks": ("stack dumps", "run `ddp-autopsy collect` while the job hangs"),
    "stack_tree": ("stack dumps", "run `ddp-autopsy collect` while the job hangs"),
    "processes": ("collect bundles", "run `ddp-autopsy collect` on each node"),
}


def not_examined(o: Outcome) -> str:
    """Why a rule did not run, and how to make it run: ``not evaluated: no Flight Recorder
    dumps in the inputs (set TORCH_FR_BUFFER_SIZE=2000 ...)`` / ``rule failed``.

    >>> from ddp_autopsy.rules.base import Outcome
    >>> not_examined(Outcome("COLL005", "collective-not-joined", "not_evaluated",
    ...                      missing=["collectives"]))[:59]
    'not evaluated: no Flight Recorder dumps in the inputs (set '
    """
    if o.status == "not_evaluated":
        names = list(dict.fromkeys(MISSING.get(m, (m, ""))[0] for m in o.missing))
        hints = list(dict.fromkeys(MISSING[m][1] for m in o.missing if m in MISSING))
        how = f" ({'; '.join(hints)})" if hints else ""
        return f"not evaluated: no {', '.join(names)} in the inputs{how}"
    last = (o.error or "").strip().splitlines()[-1:] or ["?"]
    return f"rule failed ({last[0]}); the other rules ran"
