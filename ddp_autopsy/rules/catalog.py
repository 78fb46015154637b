"""The rules catalog, generated from the rules' docstrings: ``docs/rules.md`` and one page per
rule under ``docs/rules/``. ``python -m ddp_autopsy.rules.catalog [--check]`` writes (or checks)
them; a test fails when they are stale."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ddp_autopsy.rules.base import DOC_SECTIONS, Rule
from ddp_autopsy.rules.engine import registry

DOCS = Path(__file__).resolve().parents[2] / "docs"


def rule_dict(rule: type[Rule]) -> dict[str, Any]:
    sections = rule.sections()
    return {
        "code": rule.code,
        "slug": rule.slug,
        "title": rule.title(),
        "cause": rule.cause,
        "role": rule.role,
        "severity": rule.severity,
        "status": rule.status,
        "requires": list(rule.requires),
        "optional": list(rule.optional),
        "sections": {name: sections.get(name, "") for name in DOC_SECTIONS},
    }


def rule_markdown(rule: type[Rule]) -> str:
    sections = rule.sections()
    out = [f"# {rule.code} {rule.slug}", "", f"**{rule.title()}**", ""]
    cause = f"`{rule.cause}`" if rule.cause else "none (reports a symptom)"
    out += [f"- cause: {cause}", f"- role: `{rule.role}`", f"- severity: `{rule.severity}`",
            f"- requires: {', '.join(f'`{i}`' for i in rule.requires) or 'nothing'}",
        *([f"- uses when present: {', '.join(f'`{i}`' for i in rule.optional)}"]
          if rule.optional else []),
        f"- status: {rule.status}",
            ""]
    for name in DOC_SECTIONS:
        out += [f"## {name}", "", sections.get(name, "").strip(), ""]
    return "\n".join(out).rstrip() + "\n"


def catalog_markdown() -> str:
    out = ["# Rules", "",
           "Generated from the rules' docstrings by `python -m ddp_autopsy.rules.catalog`; "
           "do not edit by hand.", "",
           "| code | slug | cause | role | what it detects |", "|---|---|---|---|---|"]
    for r in registry():
        out.append(f"| [{r.code}](rules/{r.code}.md) | {r.slug} | {r.cause or '—'} | {r.role} "
                   f"| {r.title()} |")
    return "\n".join(out) + "\n"


def expected_files() -> dict[Path, str]:
    files = {DOCS / "rules.md": catalog_markdown()}
    for r in registry():
        files[DOCS / "rules" / f"{r.code}.md"] = rule_markdown(r)
    return files


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in expected_files().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if check and stale:
        print("stale generated docs: " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
