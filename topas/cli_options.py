"""Command-line options shared by the commands that run a trace (``topas simulate``, ``topas
replay``): how its tasks are re-timed and how many run, and what the policy may know."""

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
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Seed of the Poisson arrivals (an integer >= 0)."),
        click.option("--tasks", "n_tasks", type=click.IntRange(min=1), default=None, metavar="N",
                     help=f"{verb} only the first N tasks of the trace."),
    ]

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def knowledge_options(f: F) -> F:
    """``--prior-noise``, ``--prior-bias``, ``--dag-visibility`` and ``--arrivals`` (issue 16):
    passed on as the :class:`topas.experiments.spec.Experiment` fields of the same names
    (``prior_noise``, ``prior_bias``, ``dag_visibility``, ``arrivals``)."""
    options = [
        click.option("--prior-noise", type=click.FloatRange(min=0), default=0.0, show_default=True, metavar="S",
                     help="Multiply each agent's output prior, as the policy sees it, by a log-normal factor "
                          "of sigma S (seeded by --seed; the engine runs the true lengths)."),
        click.option("--prior-bias", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
                     metavar="B", help="Multiply every output prior the policy sees by B."),
        click.option("--dag-visibility", type=click.Choice(["full", "online"]), default="full", show_default=True,
                     help="online: the policy sees a task's stages only once they are ready."),
        click.option("--arrivals", default="poisson", show_default=True, metavar="poisson|gamma:CV",
                     help="Arrival process of --rate/--load: Poisson, or a gamma renewal process of the same "
                          "mean rate and coefficient of variation CV (bursts for CV > 1)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f
