r"""Configuration (docs/config.md): ``[tool.ddp-autopsy]`` in ``pyproject.toml`` or a
``ddp-autopsy.toml``, found from the current directory upwards (the first directory holding
either wins; ``ddp-autopsy.toml`` before ``pyproject.toml``), or given with ``--config``.

```toml
[tool.ddp-autopsy]              # in ddp-autopsy.toml: the same keys at the top level
select = ["RDZV", "COLL001"]     # only these rules (codes or code prefixes, or slugs)
ignore = ["SYM003"]              # never these
severity = {CRASH001 = "critical", NCCL006 = "warning"}

[tool.ddp-autopsy.patterns.disk-quota]   # extra log patterns, read like the built-in ones
regex = 'OSError: \[Errno 122\] Disk quota exceeded'
kind = "disk_quota"              # a new event kind, or a built-in one (a new wording of it)
severity = "error"               # new kinds: critical, error = failure; warning, info = context
```

Patterns also come from other packages (entry points ``ddp_autopsy.patterns``, each a mapping
of name to the same table). :meth:`Config.installed` makes the analysis read them: the reader's
pattern tables are process-wide, so two analyses with different patterns must not run at once
in one process.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.patterns import Pattern
    from ddp_autopsy.rules.base import Finding, Rule

FILE_NAME = "ddp-autopsy.toml"
SEVERITIES = ("critical", "error", "warning", "info")
KEYS = ("select", "ignore", "severity", "patterns")
PATTERN_KEYS = ("regex", "kind", "severity", "needles")
#: Entry-point group of log patterns from other packages (docs/config.md).
PATTERN_GROUP = "ddp_autopsy.patterns"
#: Pattern plugins that could not be used: (entry point, why); listed like rule plugins.
PATTERN_PLUGIN_ERRORS: list[tuple[str, str]] = []
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
#: The literal a needle must have at least, to pre-filter lines usefully.
MIN_NEEDLE = 3


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ExtraPattern:
    """A log pattern from the configuration or a plugin: lines matching ``regex`` (and holding
    one of ``needles``) become events of ``kind``; named groups become the event's fields."""

    name: str
    kind: str
    regex: str
    needles: tuple[str, ...]
    #: New kinds: critical / error make a failure, warning / info context. None: a built-in
    #: kind, whose tags (and rules) decide.
    severity: str | None
    source: str  # the configuration file, or "plugin PACKAGE (entry point)"

    @property
    def tags(self) -> frozenset[str]:
        return frozenset({"failure"} if self.severity in ("critical", "error") else {"info"})

    def compiled(self) -> Pattern:
        """The catalog's :class:`~ddp_autopsy.analyzer.patterns.Pattern`; a built-in kind
        keeps the built-in field types (``port`` an int)."""
        from ddp_autopsy.analyzer import patterns as P

        types = next((p.types for p in P.PATTERNS if p.kind == self.kind), ())
        rx = re.compile(self.regex)
        return P.Pattern(self.kind, self.needles, rx,
                         tuple(t for t in types if t[0] in rx.groupindex))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "regex": self.regex,
                "needles": list(self.needles), "severity": self.severity,
                "source": self.source}


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    severity: dict[str, str] = field(default_factory=dict)
    #: Extra log patterns: the plugins' first, then the file's.
    patterns: list[ExtraPattern] = field(default_factory=list)
    #: Where it came from (None: the defaults, no file).
    path: Path | None = None

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Within this block the analysis (reading and rules) reads :attr:`patterns`, and only
        them; the patterns in use before come back after it. Process-wide (see the module
        docstring)."""
        before = _INSTALLED[0]
        install_patterns(self.patterns)
        try:
            yield
        finally:
            install_patterns(before)

    def rules(self, registry: tuple[type[Rule], ...]) -> tuple[type[Rule], ...]:
        """The rules to run: ``select`` (all when empty) less ``ignore``."""
        chosen = [r for r in registry if not self.select or _matches(r, self.select)]
        chosen = [r for r in chosen if not _matches(r, self.ignore)]
        if not chosen:
            raise ConfigError(f"{self.path}: select and ignore leave no rule to run")
        return tuple(chosen)

    def apply(self, findings: list[Finding]) -> None:
        """Severity overrides, in place."""
        for f in findings:
            new = self.severity.get(f.rule) or self.severity.get(f.slug)
            if new:
                f.severity = new  # type: ignore[assignment]


def _matches(rule: type[Rule], names: list[str]) -> bool:
    return any(rule.code.startswith(n.upper()) or rule.slug == n.lower() for n in names)


def _toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err


def find(start: Path | None = None) -> Path | None:
    """The configuration file that applies in ``start`` (default: the current directory)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        own = d / FILE_NAME
        if own.is_file():
            return own
        py = d / "pyproject.toml"
        if py.is_file():
            try:
                if "ddp-autopsy" in (_toml(py).get("tool") or {}):
                    return py
            except ConfigError:
                continue  # someone else's broken pyproject is not ours to report
    return None


def load(path: Path | None = None, *, discover: bool = True) -> Config:
    """The configuration in ``path``, or the one :func:`find` finds (``discover``), or the
    defaults. Raises :class:`ConfigError` for unknown keys, rules or severities."""
    if path is None and discover:
        path = find()
    plugins = plugin_patterns()
    if path is None:
        return Config(patterns=plugins)
    data = _toml(path)
    if path.name == "pyproject.toml" or "tool" in data:
        section = (data.get("tool") or {}).get("ddp-autopsy")
        if section is None:
            raise ConfigError(f"{path}: no [tool.ddp-autopsy] table")
        where = "[tool.ddp-autopsy]"
    else:
        section, where = data, "the top level"
    config = _validate(section, path, where)
    config.patterns = [*plugins, *config.patterns]
    return config


def _validate(section: Any, path: Path, where: str) -> Config:
    from difflib import get_close_matches

    from ddp_autopsy.rules.engine import registry

    if not isinstance(section, dict):
        raise ConfigError(f"{path}: {where} is not a table")
    unknown = [k for k in section if k not in KEYS]
    if unknown:
        close = get_close_matches(unknown[0], KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} in {where}{hint}; "
                          f"known: {', '.join(KEYS)}")
    rules = registry()
    names = [r.code for r in rules] + [r.slug for r in rules]

    def rule_list(key: str) -> list[str]:
        value = section.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: {key} must be a list of rule codes, e.g. [\"RDZV001\"]")
        for v in value:
            if not any(_matches(r, [v]) for r in rules):
                close = get_close_matches(v.upper(), names, n=1) or \
                    get_close_matches(v.lower(), names, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"{path}: {key}: no rule matches {v!r}{hint}")
        return value

    select, ignore = rule_list("select"), rule_list("ignore")
    sev = section.get("severity", {})
    if not isinstance(sev, dict):
        raise ConfigError(f"{path}: severity must be a table of CODE = \"level\"")
    for code, level in sev.items():
        if not any(r.code == code.upper() or r.slug == code.lower() for r in rules):
            raise ConfigError(f"{path}: severity: no rule {code!r}")
        if level not in SEVERITIES:
            raise ConfigError(f"{path}: severity.{code}: {level!r} is not one of "
                              f"{', '.join(SEVERITIES)}")
    severity = {next(r.code for r in rules if r.code == c.upper() or r.slug == c.lower()): lv
                for c, lv in sev.items()}
    table = section.get("patterns", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: patterns must be a table of named patterns, e.g. "
                          "[tool.ddp-autopsy.patterns.disk-quota]")
    try:
        patterns = parse_patterns(table, str(path))
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from err
    return Config(select=select, ignore=ignore, severity=severity, patterns=patterns, path=path)


# --- extra log patterns ------------------------------------------------------------------------

def parse_patterns(table: Mapping[str, Any], source: str) -> list[ExtraPattern]:
    """Validate ``{name: {regex, kind, severity?, needles?}}``; ValueError names the pattern
    and the key (``patterns.disk-quota.regex: ...``)."""
    from difflib import get_close_matches


    builtin = set(builtin_kinds())
    out = []
    for name, entry in table.items():
        where = f"patterns.{name}"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a table with regex and kind")
        unknown = [k for k in entry if k not in PATTERN_KEYS]
        if unknown:
            close = get_close_matches(str(unknown[0]), PATTERN_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown key {unknown[0]!r} in {where}{hint}; known: "
                             f"{', '.join(PATTERN_KEYS)}")
        regex, kind = entry.get("regex"), entry.get("kind")
        if not isinstance(regex, str) or not regex:
            raise ValueError(f"{where}.regex: a regular expression (Python syntax) is needed")
        try:
            re.compile(regex)
        except re.error as err:
            raise ValueError(f"{where}.regex: not a valid regex: {err}") from err
        if not isinstance(kind, str) or not _KIND.match(kind):
            raise ValueError(f"{where}.kind: an event kind is needed, in lower case with "
                             f"underscores (e.g. \"disk_quota\"), or a built-in one such as "
                             f"\"port_in_use\"")
        severity = entry.get("severity")
        if kind in builtin and severity is not None:
            raise ValueError(f"{where}.severity: {kind!r} is a built-in kind, whose rules "
                             "decide what it means; leave severity out (or name a new kind)")
        if kind not in builtin:
            severity = severity or "error"
            if severity not in SEVERITIES:
                raise ValueError(f"{where}.severity: {severity!r} is not one of "
                                 f"{', '.join(SEVERITIES)}")
            other = next((p for p in out if p.kind == kind and p.severity != severity), None)
            if other is not None:
                raise ValueError(f"{where}.severity: kind {kind} is {other.severity!r} in "
                                 f"patterns.{other.name}: one kind, one severity")
        needles = entry.get("needles")
        if needles is None:
            literal = _longest_literal(regex)
            if literal is None:
                raise ValueError(
                    f"{where}: no literal text of at least {MIN_NEEDLE} characters that every "
                    f"match holds; give needles = [\"...\"] (strings one of which every "
                    f"matching line contains: lines without one are never tried)")
            needles = [literal]
        if not isinstance(needles, list) or not needles or not all(
                isinstance(n, str) and n for n in needles):
            raise ValueError(f"{where}.needles must be a list of non-empty strings")
        out.append(ExtraPattern(str(name), kind, regex, tuple(needles), severity, source))
    return out


def _longest_literal(regex: str) -> str | None:
    """The longest run of literal characters at the regex's top level (every match holds it),
    or None (alternatives at the top, case-insensitive, or nothing long enough)."""
    if sys.version_info >= (3, 11):
        import re._parser as sre
    else:  # pragma: no cover
        import sre_parse as sre
    parsed = sre.parse(regex)
    if parsed.state.flags & re.IGNORECASE:
        return None
    best, run = "", []
    for op, arg in [*parsed.data, (None, None)]:
        if op == sre.LITERAL:
            run.append(chr(arg))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    return best if len(best.strip()) >= MIN_NEEDLE else None


def plugin_patterns() -> list[ExtraPattern]:
    """Patterns from the ``ddp_autopsy.patterns`` entry points (each a mapping of name to a
    pattern table, as in the configuration). A plugin that fails to load or holds an invalid
    pattern is left out, noted in PATTERN_PLUGIN_ERRORS; it never stops the analysis."""
    from importlib.metadata import entry_points

    PATTERN_PLUGIN_ERRORS.clear()
    out: list[ExtraPattern] = []
    for ep in sorted(entry_points(group=PATTERN_GROUP), key=lambda e: e.name):
        where = f"{ep.name} = {ep.value}"
        package = ep.dist.name if ep.dist is not None else ep.value.split(".")[0]
        try:
            obj = ep.load()
            if not isinstance(obj, Mapping):
                raise ValueError("not a mapping of pattern name to {regex, kind, ...}")
            found = parse_patterns(obj, f"plugin {package}")
        except Exception as err:  # a broken plugin must not break the analysis
            PATTERN_PLUGIN_ERRORS.append((where, f"{type(err).__name__}: {err}"))
            continue
        out += [ExtraPattern(f"{ep.name}.{p.name}", p.kind, p.regex, p.needles, p.severity,
                             p.source) for p in found]
    return out


_BUILTIN: dict[str, Any] = {}
#: The extra patterns in use now.
_INSTALLED: list[tuple[ExtraPattern, ...]] = [()]


def builtin_kinds() -> tuple[str, ...]:
    """The event kinds of the built-in catalog (without those extra patterns added)."""
    from ddp_autopsy.analyzer import patterns as P

    return tuple(sorted(_BUILTIN["tags"] if _BUILTIN else P.TAGS))


def install_patterns(extra: Sequence[ExtraPattern]) -> None:
    """Set the extra patterns the log reader tries, after the built-in ones.

    The reader (``analyzer/events.py``) derives its pre-filter and needle tables from the
    catalog once, at import; they are rebuilt here from the built-in ones plus ``extra``. The
    catalog hash includes them, so collect's pre-parsed summaries (made without them) are not
    used and the raw logs are read. New kinds get tags from their severity.
    """
    import polars as pl

    from ddp_autopsy.analyzer import events as E
    from ddp_autopsy.analyzer import patterns as P

    if not _BUILTIN:
        _BUILTIN.update(catalog=P.PATTERNS, reader=E.PATTERNS, needles=E.NEEDLES,
                        tags=dict(P.TAGS))
    if tuple(extra) == _INSTALLED[0]:
        return  # in use already
    _INSTALLED[0] = tuple(extra)
    compiled = tuple(x.compiled() for x in extra)
    P.PATTERNS = (*_BUILTIN["catalog"], *compiled)
    P.TAGS.clear()
    P.TAGS.update(_BUILTIN["tags"])
    for x in extra:
        if x.severity is not None:
            P.TAGS[x.kind] = P.TAGS.get(x.kind, frozenset()) | x.tags
    E.PATTERNS = (*_BUILTIN["reader"], *compiled)
    E._BY_NEEDLE.clear()
    for i, pat in enumerate(E.PATTERNS):
        for needle in pat.needles:
            E._BY_NEEDLE.setdefault(needle, []).append(i)
    E._NEEDLE_LIST = sorted(E._BY_NEEDLE)
    E.FOUND = pl.col("text").str.extract_many(E._NEEDLE_LIST, overlapping=True).alias("found")
    E.NEEDLES = tuple(dict.fromkeys((*_BUILTIN["needles"],
                                     *(n for x in extra for n in x.needles))))
    E.FIRST_LEVEL = pl.col("text").str.contains(E._rx(E.anchor_literals(E.NEEDLES)))
    E.SECOND_LEVEL = pl.col("text").str.contains(E._rx(E.NEEDLES))
    E._patterns_for.cache_clear()
