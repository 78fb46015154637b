"""Run the catalog over a Job and rank the findings: root cause first, symptoms linked to it.

A hang or crash produces errors on every rank; most are consequences. Each rule marks its own
findings as root cause or symptom; the engine then settles between root causes: a generic one
(a rank crashed, ranks missing, master unreachable) that a more specific one explains is demoted
to a symptom of it, and every symptom is linked to the root cause it follows from.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Outcome, Rule

AREAS = ("rdzv", "env", "nccl", "coll", "crash", "sym", "aut")


@cache
def registry() -> tuple[type[Rule], ...]:
    """Every rule class, found as ``ddp_autopsy.rules.<area>.<code>_<slug>`` modules."""
    import ddp_autopsy.rules as pkg

    found: list[type[Rule]] = []
    for area in AREAS:
        try:
            sub = importlib.import_module(f"{pkg.__name__}.{area}")
        except ModuleNotFoundError:
            continue
        for info in pkgutil.iter_modules(sub.__path__):
            if info.name.startswith("_"):  # shared helpers, not rules
                continue
            module = importlib.import_module(f"{sub.__name__}.{info.name}")
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                    found.append(obj)
    found += _plugin_rules({r.code for r in found} | {r.slug for r in found})
    return tuple(sorted(found, key=lambda r: r.code))


#: Entry-point group of rules from other packages (docs/config.md).
PLUGIN_GROUP = "ddp_autopsy.rules"
#: Plugins that could not be loaded: (entry point, why). ``ddp-autopsy rules`` prints them.
PLUGIN_ERRORS: list[tuple[str, str]] = []


def _plugin_rules(taken: set[str]) -> list[type[Rule]]:
    """Rules from the ``ddp_autopsy.rules`` entry points: each names a Rule subclass or a module
    (its Rule subclasses). A plugin that fails to import, or reuses a code or slug, is left out
    and noted in PLUGIN_ERRORS; it never stops the built-in rules."""
    from importlib.metadata import entry_points

    PLUGIN_ERRORS.clear()
    rules: list[type[Rule]] = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        where = f"{ep.name} = {ep.value}"
        try:
            obj = ep.load()
        except Exception as err:  # a broken plugin must not break the analysis
            PLUGIN_ERRORS.append((where, f"{type(err).__name__}: {err}"))
            continue
        if inspect.ismodule(obj):
            found = [c for _, c in inspect.getmembers(obj, inspect.isclass)
                     if issubclass(c, Rule) and c is not Rule and c.__module__ == obj.__name__]
        elif inspect.isclass(obj) and issubclass(obj, Rule):
            found = [obj]
        else:
            PLUGIN_ERRORS.append((where, "not a Rule subclass or a module of them"))
            continue
        for rule in found:
            code, slug = getattr(rule, "code", None), getattr(rule, "slug", None)
            if not code or not slug:
                PLUGIN_ERRORS.append((where, f"{rule.__name__} has no code or slug"))
            elif code in taken or slug in taken:
                PLUGIN_ERRORS.append((where, f"{code} {slug} is taken by another rule"))
            else:
                taken |= {code, slug}
                rules.append(rule)
    return rules


def get_rule(code: str) -> type[Rule] | None:
    code = code.upper()
    for rule in registry():
        if rule.code == code or rule.slug == code.lower():
            return rule
    return None


@dataclass
class Analysis:
    job: Job
    findings: list[Finding] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def verdict(self) -> Finding | None:
        return next((f for f in self.findings if f.role == "root_cause"), None)


def run(job: Job, rules: tuple[type[Rule], ...] | None = None) -> Analysis:
    analysis = Analysis(job)
    chosen = rules or registry()
    for rule_cls in [r for r in chosen if not r.fallback]:
        _run_rule(rule_cls, job, analysis)
    fallbacks = [r for r in chosen if r.fallback]
    if any(f.role == "root_cause" for f in analysis.findings):
        analysis.outcomes += [Outcome(r.code, r.slug, "ruled_out") for r in fallbacks]
    else:
        tried = [o.rule for o in analysis.outcomes if o.status in ("ruled_out", "finding")]
        for rule_cls in fallbacks:
            for f in _run_rule(rule_cls, job, analysis):
                f.details["rules_tried"] = tried
    analysis.outcomes.sort(key=lambda o: o.rule)
    analysis.findings = rank_findings(analysis.findings)
    return analysis


def _run_rule(rule_cls: type[Rule], job: Job, analysis: Analysis) -> list[Finding]:
    """Run one rule, record its outcome and findings; return the findings."""
    missing = [name for name in rule_cls.requires if not job.has(name)]
    if missing:
        analysis.outcomes.append(Outcome(rule_cls.code, rule_cls.slug, "not_evaluated",
                                         missing=missing))
        return []
    try:
        found = list(rule_cls().check(job))
        if not all(isinstance(f, Finding) for f in found):
            raise TypeError(f"{rule_cls.code}.check must yield Finding objects")
    except Exception:  # one rule's bug must not hide the others' findings
        analysis.outcomes.append(Outcome(rule_cls.code, rule_cls.slug, "errored",
                                         error=traceback.format_exc()))
        return []
    analysis.outcomes.append(Outcome(rule_cls.code, rule_cls.slug,
                                     "finding" if found else "ruled_out", findings=found))
    analysis.findings.extend(found)
    return found


# Causes that say little by themselves: another root cause usually explains them.
GENERIC = {"network_error_runtime": 4, "rank_crashed": 3, "job_terminated": 2.5,
           "missing_ranks": 2, "master_unreachable": 1, "unclassified_failure": 9}
# What can explain what (beyond "any specific cause explains a crash of an overlapping rank").
EXPLAINS = {
    "port_in_use": {"master_unreachable", "missing_ranks", "rank_crashed"},
    "unresolved_host": {"master_unreachable", "missing_ranks", "rank_crashed"},
    "master_unreachable": {"missing_ranks", "rank_crashed"},
    "stale_init_file": {"missing_ranks", "rank_crashed", "nccl_connection_failure"},
    "no_socket_interface": {"master_unreachable", "missing_ranks", "rank_crashed",
                            "nccl_connection_failure"},
    "loopback_address": {"nccl_connection_failure", "missing_ranks", "rank_crashed"},
    "config_mismatch": {"missing_ranks", "rank_crashed", "collective_mismatch"},
    "version_mismatch": {"nccl_connection_failure", "rank_crashed", "collective_mismatch"},
    # A crash resets its connections: network errors after it are consequences.
    "rank_crashed": {"network_error_runtime", "nccl_connection_failure"},
    "out_of_memory": {"network_error_runtime", "nccl_connection_failure"},
    # Stopping a job mid-step breaks its connections and makes its ranks raise.
    "job_terminated": {"network_error_runtime", "nccl_connection_failure", "missing_ranks"},
}
_TS_MAX = datetime.max
#: Failures of a rank's own set-up, before it joins the others.
SETUP_FAILURES = frozenset({"backend_device_mismatch", "version_mismatch", "config_mismatch",
                            "duplicate_gpu", "no_socket_interface"})


def _explains(a: Finding, b: Finding) -> bool:
    if a is b or a.cause is None or b.cause is None or a.cause == b.cause:
        return False
    if {a.cause, b.cause} == {"rank_crashed", "master_unreachable"} and a.ts and b.ts:
        # A rank that crashed before the store failed took the store (or its node) down: the
        # others' "store has failed" errors are its consequence. Before any crash, an unreachable
        # master explains the crashes that follow.
        crash, store = (a, b) if a.cause == "rank_crashed" else (b, a)
        return (a is crash) == (crash.ts <= store.ts)
    if b.cause in EXPLAINS.get(a.cause, set()):
        return True
    if a.cause == "network_error_runtime" and b.cause == "missing_ranks" \
            and a.details.get("timed_out"):
        # Every rank timed out inside a collective: all of them had joined; what never arrived
        # is the traffic the network dropped.
        return True
    if a.cause == "network_error_runtime" and a.details.get("timed_out_from") \
            and b.cause in ("collective_mismatch", "missing_ranks"):
        # A node seen cut off (its listening port unreachable from the others): ranks stall
        # wherever the dropped traffic left them, one collective apart, or never heard of.
        return True
    ra, rb = set(a.ranks), set(b.ranks)
    if a.cause == "job_terminated" and b.cause == "rank_crashed":
        # The crashes that followed the signal are its consequence; an earlier one is not.
        first = _came_first(a, b)
        return first is None or first is a
    if a.cause == "rank_crashed" and b.cause == "job_terminated":
        # A crash before the signal: the job was failing already (a wrapper or a scheduler
        # then stopped the rest).
        return _came_first(a, b) is a
    if {a.cause, b.cause} == {"rank_crashed", "rank_stuck_outside_collective"}:
        # A rank that died is one the others wait for: the crash explains "some rank never
        # reached the collective" when that rank is unknown or is the crashed one, never the
        # other way round.
        return a.cause == "rank_crashed" and (not rb or bool(ra & rb))
    if b.cause == "rank_crashed" and a.cause not in GENERIC:
        # A specific failure explains the crash of the ranks it names (or of any rank when it is
        # not rank-specific, like a port or a host).
        return not ra or not rb or bool(ra & rb)
    if b.cause == "missing_ranks" and a.cause == "rank_crashed":
        return bool(ra) and (not rb or ra <= rb)
    if b.cause == "missing_ranks" and a.cause in SETUP_FAILURES:
        # A rank whose set-up failed (a backend its build lacks, a version it cannot run) is
        # the rank that never joined: that failure is why.
        return bool(ra) and bool(rb) and rb <= ra
    if b.cause == "rank_crashed" and a.cause == "missing_ranks":
        return bool(ra) and not (ra & rb)
    if a.cause == "uneven_inputs" and b.cause == "rank_stuck_outside_collective":
        # Ranks that ran out of data are the ones the others wait for, outside any collective.
        return bool(ra) and (not rb or rb <= ra)
    return b.cause == "rank_stuck_outside_collective" and a.cause == "collective_mismatch"


def _came_first(a: Finding, b: Finding) -> Finding | None:
    """The finding whose evidence came first: by their times, else by their first lines in one
    file (a console that stamps some lines only); None when neither says."""
    if a.ts is not None and b.ts is not None:
        return a if a.ts <= b.ts else b
    lines_a = {e.path: e.line for e in reversed(a.evidence) if e.line is not None}
    for e in b.evidence:
        if e.line is not None and e.path in lines_a:
            return a if lines_a[e.path] <= e.line else b
    return None


#: Below this confidence a root cause is a suspicion (a fragment's likely rank, a base rate):
#: it comes after every cause that read its evidence, generic ones included.
SUSPICION = 0.35


def _order_key(f: Finding) -> tuple[int, float, float, datetime]:
    role_order = {"root_cause": 0, "symptom": 1, "info": 2}[f.role]
    generic = GENERIC.get(f.cause or "", 0)
    if f.confidence < SUSPICION:
        generic = max(generic, 5)
    return (role_order, generic, -f.confidence, f.ts or _TS_MAX)


def rank_findings(findings: list[Finding]) -> list[Finding]:
    findings = sorted(findings, key=_order_key)
    roots = [f for f in findings if f.role == "root_cause"]
    for idx, f in enumerate(findings, 1):
        f.id = f"F{idx}"
    for b in roots:
        for a in roots:
            if a.role == "root_cause" and _explains(a, b) and not _explains(b, a):
                b.role, b.explained_by = "symptom", a.id
                b.severity = "warning" if b.severity in ("critical", "error") else b.severity
                break
    # Two rules reaching the same diagnosis (same cause, same ranks) from different evidence:
    # the more certain one stays the root cause, the other is kept as corroborating context.
    for i, b in enumerate(roots):
        for a in roots[:i]:
            if a.role == "root_cause" and b.role == "root_cause" and a.cause == b.cause \
                    and set(a.ranks) == set(b.ranks):
                b.role, b.explained_by = "info", a.id
                break
    top = next((f for f in findings if f.role == "root_cause"), None)
    for f in findings:
        if f.role == "symptom" and f.explained_by is None and top is not None:
            f.explained_by = top.id
            if f.cause is None:
                f.cause = top.cause
    findings = sorted(findings, key=_order_key)
    # Renumber in final order, keeping the links.
    mapping = {}
    for idx, f in enumerate(findings, 1):
        mapping[f.id] = f"F{idx}"
    for f in findings:
        f.id = mapping[f.id]
        if f.explained_by:
            f.explained_by = mapping.get(f.explained_by, f.explained_by)
    return findings
