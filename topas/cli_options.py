"""Command-line options shared by the commands that run a trace (``topas simulate``, ``topas
replay``): how its tasks are re-timed and how many run."""

from __future__ import annotations

from typing import Callable, TypeVar

import click

F = TypeVar("F", bound=Callable)


def arrival_options(verb: str) -> Callable[[F], F]:
    """``--rate``, ``--load``, ``--seed`` and ``--tasks``; ``verb`` says what happens to the
    first N tasks ("Simulate", "Replay")."""
    options = [
        click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="R",
                     help="Re-time the tasks with Poisson arrivals of R tasks/s."),
        click.option("--load", type=click.FloatRange(min=0, min_open=True), default=None, metavar="X",
                     help="Re-time the tasks with Poisson arrivals at X times the trace's nominal rate."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the Poisson arrivals."),
        click.option("--tasks", "n_tasks", type=click.IntRange(min=1), default=None, metavar="N",
                     help=f"{verb} only the first N tasks of the trace."),
    ]

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply
