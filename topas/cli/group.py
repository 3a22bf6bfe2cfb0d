"""The ``topas`` click group every command is added to, and how a command fails."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from topas import __version__

__all__ = ["fail", "main"]


def fail(message: str) -> NoReturn:
    """Print ``message`` on stderr and exit with status 1."""
    click.echo(message, err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="topas")
def main() -> None:
    """TOPAS reproduction: workflow-aware prefix-state scheduling for multi-agent LLM serving."""
