"""Score the redaction engine against its two corpora (docs/redaction.md).

    python scripts/redaction_score.py [--verbose] [--engine MODULE]

* ``tests/redaction/secrets.txt`` — planted secrets; a case passes when no text between its
  ``⟦ ⟧`` marks survives :func:`ddp_autopsy.redact.redact_text` (target: 100 %);
* ``tests/redaction/harmless.txt`` — ordinary training-log lines; a line passes when it comes
  through unchanged (target: at least 95 %).

``--engine`` scores another module with the same ``redact_text`` (e.g. an older redact.py copied
aside) to compare. Exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "redaction"
OPEN, CLOSE, NEWLINE, COMMENT = "⟦", "⟧", "↵", "## "


@dataclass(frozen=True)
class SecretCase:
    lineno: int
    text: str  # the input, marks removed, ↵ turned into line breaks
    secrets: tuple[str, ...]


def load_secrets(path: Path = CORPUS / "secrets.txt") -> list[SecretCase]:
    cases = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not raw or raw.startswith(COMMENT) or raw == COMMENT.strip():
            continue
        line = raw.replace(NEWLINE, "\n")
        secrets, text, rest = [], [], line
        while OPEN in rest:
            before, _, after = rest.partition(OPEN)
            secret, found, rest = after.partition(CLOSE)
            if not found:
                raise ValueError(f"{path}:{lineno}: {OPEN} without {CLOSE}")
            text += [before, secret]
            secrets.append(secret)
        if not secrets:
            raise ValueError(f"{path}:{lineno}: a case with no {OPEN}secret{CLOSE}")
        cases.append(SecretCase(lineno, "".join(text) + rest, tuple(secrets)))
    return cases


def load_harmless(path: Path = CORPUS / "harmless.txt") -> list[tuple[int, str]]:
    return [(lineno, line)
            for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
            if line and not line.startswith(COMMENT) and line != COMMENT.strip()]


def leaks(redact: Callable[[str], str], case: SecretCase) -> list[str]:
    """The planted secrets (or, for multi-line ones, their lines) still in the output."""
    out = redact(case.text)
    return [part for secret in case.secrets for part in secret.split("\n")
            if part.strip() and part in out]


@dataclass
class Score:
    secrets: int
    masked: int
    harmless: int
    unchanged: int

    @property
    def masked_pct(self) -> float:
        return 100.0 * self.masked / self.secrets if self.secrets else 100.0

    @property
    def unchanged_pct(self) -> float:
        return 100.0 * self.unchanged / self.harmless if self.harmless else 100.0


def score(redact: Callable[[str], str], verbose: bool = False) -> Score:
    cases, lines = load_secrets(), load_harmless()
    masked = 0
    for case in cases:
        leaked = leaks(redact, case)
        masked += not leaked
        if leaked and verbose:
            print(f"LEAK   secrets.txt:{case.lineno}: {leaked} in {redact(case.text)!r}")
    unchanged = 0
    for lineno, line in lines:
        out = redact(line)
        unchanged += out == line
        if out != line and verbose:
            print(f"ALTERED harmless.txt:{lineno}: {line!r}\n                 -> {out!r}")
    return Score(len(cases), masked, len(lines), unchanged)


def _engine(name: str) -> Callable[[str], str]:
    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("engine_under_test", name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(name)
    return module.redact_text  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="list leaks and changes")
    parser.add_argument("--engine", default="ddp_autopsy.redact",
                        help="module name or .py file with redact_text (default: %(default)s)")
    args = parser.parse_args(argv)
    s = score(_engine(args.engine), verbose=args.verbose)
    print(f"planted secrets masked:    {s.masked}/{s.secrets} ({s.masked_pct:.1f} %, target 100 %)")
    print(f"harmless lines unchanged:  {s.unchanged}/{s.harmless} ({s.unchanged_pct:.1f} %, "
          f"target >= 95 %)")
    return 0 if s.masked == s.secrets and s.unchanged_pct >= 95.0 else 1


if __name__ == "__main__":
    sys.exit(main())
