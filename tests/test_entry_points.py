"""Both ways to start the tool — ``python -m ddp_autopsy`` and the installed ``ddp-autopsy``
console script — run in a fresh process and behave the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddp_autopsy import __version__
from ddp_autopsy.cli import main

SCRIPT = Path(sys.executable).parent / "ddp-autopsy"
ENTRY_POINTS = {"module": [sys.executable, "-m", "ddp_autopsy"], "script": [str(SCRIPT)]}
README_COMMANDS = {"analyze", "collect", "demo", "report"}


def run_both(args: list[str], cwd: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    assert SCRIPT.is_file(), f"console script not installed next to {sys.executable}"
    return {name: subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True,
                                 timeout=60)
            for name, cmd in ENTRY_POINTS.items()}


def test_version(tmp_path: Path) -> None:
    for name, res in run_both(["--version"], tmp_path).items():
        assert res.returncode == 0, f"{name}: {res.stderr}"
        assert res.stdout.strip() == f"ddp-autopsy, version {__version__}", name


def test_help_lists_every_command_the_same_way(tmp_path: Path) -> None:
    res = run_both(["--help"], tmp_path)
    for name, r in res.items():
        assert r.returncode == 0, f"{name}: {r.stderr}"
        listed = {ln.split()[0] for ln in r.stdout.split("Commands:")[1].splitlines()
                  if ln.strip()}
        assert listed == set(main.commands) >= README_COMMANDS, f"{name}: {listed}"
    # Only the program name in the usage line may differ.
    module, script = (r.stdout.splitlines() for r in res.values())
    assert module[0] == "Usage: python -m ddp_autopsy [OPTIONS] COMMAND [ARGS]..."
    assert script[0] == "Usage: ddp-autopsy [OPTIONS] COMMAND [ARGS]..."
    assert module[1:] == script[1:]


@pytest.mark.parametrize(("args", "code"), [
    (["rules", "--format", "json"], 0),
    (["analyze"], 2),  # usage error
    (["analyze", "missing.log"], 3),  # nothing readable
])
def test_same_output_and_exit_code(args: list[str], code: int, tmp_path: Path) -> None:
    module, script = run_both(args, tmp_path).values()
    assert module.returncode == script.returncode == code, (module.stderr, script.stderr)
    assert module.stdout == script.stdout
    assert module.stderr.replace("python -m ddp_autopsy", "ddp-autopsy") == script.stderr
