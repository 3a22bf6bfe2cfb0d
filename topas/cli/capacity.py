"""``topas capacity``: the highest load each policy sustains on each workload."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from topas.cli.group import fail, main


@main.command("capacity")
@click.argument("workloads", nargs=-1, required=True, metavar="WORKLOAD [WORKLOAD...]")
@click.option("--policies", default="fcfs,lpm,spf,parrot-fcfs,autellix-las,topas", metavar="P1,P2,...",
              show_default=True, help="Comma-separated policies to measure.")
@click.option("--tasks", "n_tasks", type=click.IntRange(min=8), default=None, metavar="N",
              help="Tasks per run [default: 200; more resolves marginal overload better].")
@click.option("--seed", "seeds", type=click.IntRange(min=0), multiple=True, default=(0,), show_default=True,
              help="Arrival seed (repeatable: the capacity is then the smallest over the seeds).")
@click.option("--load-sat", type=click.FloatRange(min=0, min_open=True), default=None, metavar="X",
              help="Saturating load (x nominal) of the deep-queue throughput columns [default: 4].")
@click.option("--steps", type=click.IntRange(min=0), default=4, show_default=True,
              help="Bisection steps of the stable-load search (each halves the bracket).")
@click.option("--engine-option", "engine_opts", multiple=True, metavar="K=V",
              help="An engine behaviour switch (repeatable; default: the stock engine).")
@click.option("--store", "store_root", type=click.Path(path_type=Path, file_okay=False), default=None,
              metavar="DIR", help="Results store to read and write [default: data/results/store].")
def capacity_cmd(workloads: tuple[str, ...], policies: str, n_tasks: int | None, seeds: tuple[int, ...],
                 load_sat: float | None, steps: int, engine_opts: tuple[str, ...], store_root: Path | None) -> None:
    """Measure each policy's capacity on each WORKLOAD and print the table.

    Capacity = the largest load (x the trace's nominal rate) found stable by a doubling and
    bisection search (docs/capacity.md); the saturated columns are the throughput under a deep
    queue at --load-sat. Runs are cached in the results store. Exit status 1 naming the bad item
    for an unknown workload, policy or engine option.
    """
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.engine.cost import ProfileError
    from topas.experiments.capacity import DEFAULT_LOAD_SAT, DEFAULT_TASKS, capacity_experiment, capacity_table
    from topas.experiments.spec import ExperimentError
    from topas.experiments.store import ResultStore
    from topas.policies.base import PolicyError, parse_param_strings
    from topas.workload.validate import TraceError

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        fail("error: --policies names no policy")
    n = n_tasks or DEFAULT_TASKS
    try:
        options = dict(parse_param_strings(engine_opts))
        for w in workloads:
            for p in names:
                capacity_experiment(w, p, n, seeds[0], load_sat or DEFAULT_LOAD_SAT, engine_options=options).key()
    except (ExperimentError, PolicyError, ProfileError, TraceError, FileNotFoundError) as e:
        fail(f"error: {e}")
    store = ResultStore(store_root) if store_root is not None else ResultStore()
    table = capacity_table(list(workloads), names, n_tasks=n, seeds=seeds, load_sat=load_sat or DEFAULT_LOAD_SAT,
                           steps=steps, engine_options=options, store=store, progress=sys.stderr.isatty())
    cols = ["workload", "policy", "capacity x nominal", "unstable at", "capacity tasks/s", "saturated x nominal",
            "saturated count x nominal", "best baseline", "fraction of best baseline", "runs", "wall_s"]
    click.echo(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    click.echo(f"({n} tasks per run, seed(s) {', '.join(map(str, seeds))}; capacity = largest stable load found, "
               "x nominal; the smallest over the seeds)")
