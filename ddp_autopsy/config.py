"""Configuration (docs/config.md): ``[tool.ddp-autopsy]`` in ``pyproject.toml`` or a
``ddp-autopsy.toml``, found from the current directory upwards (the first directory holding
either wins; ``ddp-autopsy.toml`` before ``pyproject.toml``), or given with ``--config``.

```toml
[tool.ddp-autopsy]              # in ddp-autopsy.toml: the same keys at the top level
select = ["RDZV", "COLL001"]     # only these rules (codes or code prefixes, or slugs)
ignore = ["SYM003"]              # never these
severity = {CRASH001 = "critical", NCCL006 = "warning"}
```
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddp_autopsy.rules.base import Finding, Rule

FILE_NAME = "ddp-autopsy.toml"
SEVERITIES = ("critical", "error", "warning", "info")
KEYS = ("select", "ignore", "severity")


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and the key."""


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    severity: dict[str, str] = field(default_factory=dict)
    #: Where it came from (None: the defaults, no file).
    path: Path | None = None

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
    if path is None:
        return Config()
    data = _toml(path)
    if path.name == "pyproject.toml" or "tool" in data:
        section = (data.get("tool") or {}).get("ddp-autopsy")
        if section is None:
            raise ConfigError(f"{path}: no [tool.ddp-autopsy] table")
        where = "[tool.ddp-autopsy]"
    else:
        section, where = data, "the top level"
    return _validate(section, path, where)


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
    return Config(select=select, ignore=ignore, severity=severity, path=path)
