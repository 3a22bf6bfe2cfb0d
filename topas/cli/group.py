"""The ``topas`` click group every command is added to, and how a command fails.

Every command shares one error path (:mod:`topas.cli_errors`): an exception that escapes it is
printed as one line on stderr (exit status 1); ``topas --debug COMMAND`` (or ``$TOPAS_DEBUG=1``)
shows the traceback instead.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from topas import __version__
from topas.cli_errors import EXIT_ERROR, debug_enabled, error_line

__all__ = ["fail", "main"]


def fail(message: str) -> NoReturn:
    """Print ``message`` on stderr and exit with status 1."""
    click.echo(message, err=True)
    sys.exit(1)


class TopasGroup(click.Group):
    """A click group whose commands' unexpected exceptions become one line (module docstring)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the one error path
            if debug_enabled(bool(ctx.meta.get("topas.debug"))):
                raise
            click.echo(error_line(e), err=True)
            sys.exit(EXIT_ERROR)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta["topas.debug"] = value
    return value


@click.group(cls=TopasGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="topas")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
              help="Show the traceback of a failure instead of its one-line message (also $TOPAS_DEBUG=1).")
def main() -> None:
    """TOPAS reproduction: workflow-aware prefix-state scheduling for multi-agent LLM serving."""
