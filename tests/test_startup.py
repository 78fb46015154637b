"""Start-up stays light: ``ddp-autopsy --help`` imports neither polars, jinja2, rich, the rules
nor the collectors (they load with the commands that use them). Timings are in
docs/performance.md; this checks what is imported, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("polars", "jinja2", "rich", "ddp_autopsy.rules", "ddp_autopsy.collectors",
         "ddp_autopsy.analyzer", "ddp_autopsy.reports")

PROBE = """
import json, sys
from ddp_autopsy.cli import main
try:
    main(sys.argv[1:], prog_name="ddp-autopsy")
except SystemExit as done:
    code = done.code
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _run(*args: str) -> tuple[str, dict]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                         check=True, timeout=120)
    text, _, last = out.stdout.rstrip().rpartition("\n")
    return text, json.loads(last)


def _loaded(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["analyze", "--help"]])
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    text, res = _run(*args)
    assert res["code"] in (0, None)
    assert text.strip()
    heavy = [name for name in HEAVY if _loaded(res["modules"], name)]
    assert heavy == [], f"{' '.join(args)} imported {heavy}"


def test_lazy_commands_are_listed_as_their_own_help_says() -> None:
    """Commands listed without importing them (``collect``, ...): the line ``--help`` shows
    must be the command's own."""
    from ddp_autopsy.cli import _LazyCommand, main

    lazy = {name: c for name, c in main.commands.items() if isinstance(c, _LazyCommand)}
    assert "collect" in lazy
    for name, listed in lazy.items():
        real = listed.load()
        assert listed.get_short_help_str(200) == real.get_short_help_str(200), name
    text, _ = _run("--help")
    assert " collect " in text


def test_collect_runs_the_real_command() -> None:
    """The listed ``collect`` hands over to the real one: its own help and its usage errors."""
    text, res = _run("collect", "--help")
    assert res["code"] == 0
    assert "--step-timeout" in text
    assert _loaded(res["modules"], "ddp_autopsy.collectors")
    out = subprocess.run([sys.executable, "-m", "ddp_autopsy", "collect", "--force"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--force only applies to --tar" in out.stderr
