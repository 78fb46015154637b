"""Command line: ``ddp-autopsy analyze | report | collect | demo | rules | rule | inspect``."""

from __future__ import annotations

import click

from ddp_autopsy import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddp-autopsy")
def main() -> None:
    """Find which rank hung or killed a PyTorch distributed job, what it was doing, and why."""
