"""The ``topas`` command line.

``topas`` is a click group; each area adds a subgroup or command to :data:`main`::

    topas --version
    topas trace validate FILE [--profile NAME | --kv-budget N]
    topas trace describe FILE

To extend it, define ``@main.command()`` / ``@main.group()`` functions here (or in a module that
this one imports). Errors a user can fix are printed as one line on stderr with exit status 1.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import NoReturn

import click

from topas import __version__


def fail(message: str) -> NoReturn:
    """Print ``message`` on stderr and exit with status 1."""
    click.echo(message, err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="topas")
def main() -> None:
    """TOPAS reproduction: workflow-aware prefix-state scheduling for multi-agent LLM serving."""


# ----------------------------------------------------------------------------- topas trace


@main.group()
def trace() -> None:
    """Validate and describe workload traces (schema topas.trace/1, data/traces/README.md)."""


def _load(file: Path, kv_budget: int | None = None):
    """Read a trace or exit 1 with the reason (missing file, unreadable, invalid trace)."""
    from topas.workload.trace_io import read_trace
    from topas.workload.validate import TraceError

    try:
        return read_trace(file, kv_budget=kv_budget)
    except FileNotFoundError:
        fail(f"error: {file}: no such file")
    except IsADirectoryError:
        fail(f"error: {file}: is a directory, not a trace file")
    except TraceError as e:
        fail(f"error: {e}")
    except OSError as e:
        fail(f"error: {file}: cannot read: {e.strerror or e}")


@trace.command("validate")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--profile", metavar="NAME", default=None,
              help="Check against this engine profile's KV budget (e.g. a100-80gb_qwen2.5-32b).")
@click.option("--kv-budget", type=click.IntRange(min=1), metavar="N", default=None,
              help="Check against a KV budget of N tokens: prefixes and single requests must fit.")
def trace_validate(file: Path, profile: str | None, kv_budget: int | None) -> None:
    """Check FILE against every rule of the trace schema; print a summary or the first error."""
    if profile is not None and kv_budget is not None:
        raise click.UsageError("give either --profile or --kv-budget, not both")
    if profile is not None:
        try:
            from topas.engine.cost import load_profile
        except ImportError as e:  # pragma: no cover - only before the engine exists
            fail(f"error: --profile needs topas.engine.cost, which cannot be imported: {e}")
        try:
            kv_budget = load_profile(profile).kv_budget_tokens
        except ValueError as e:  # ProfileError
            fail(f"error: {e}")
    t = _load(file, kv_budget)
    budget = f" (fits a KV budget of {kv_budget} tokens)" if kv_budget is not None else ""
    click.echo(f"OK: {len(t.tasks)} tasks, {t.num_requests} requests, {len(t.agents)} agents{budget}")


def _mmm(values: list[int]) -> tuple[str, str, str]:
    if not values:
        return ("-", "-", "-")
    return (f"{statistics.fmean(values):.1f}", str(min(values)), str(max(values)))


def describe_lines(t, source: str = "") -> list[str]:
    """The ``topas trace describe`` report of a trace, as lines."""
    from topas.workload.critical_path import longest_remaining_path

    tasks = t.tasks
    lines = [f"trace      {t.name}" + (f"  ({source})" if source else "")]
    meta = dict(t.meta)
    if meta.get("description"):
        lines.append(f"about      {meta['description']}")
    if meta.get("generator"):
        extra = "".join(f"  {k} {meta[k]}" for k in ("seed", "rate") if k in meta)
        lines.append(f"generator  {meta['generator']}{extra}")
    lines.append(f"tasks      {len(tasks)}")
    lines.append(f"requests   {t.num_requests}")
    lines.append(f"agents     {len(t.agents)}")
    if tasks:
        first, last = tasks[0].arrival, tasks[-1].arrival
        span = last - first
        rate = f"{(len(tasks) - 1) / span:.4g} tasks/s" if span > 0 else "n/a"
        lines.append(f"arrivals   {first:.3f} .. {last:.3f} s (span {span:.3f} s), mean rate {rate}"
                     " = (tasks - 1) / span")
        n_st = [len(x.stages) for x in tasks]
        depth = [int(longest_remaining_path(x.topo_order, x.children, lambda v: 1.0)) for x in tasks]
        mean, lo, hi = _mmm(n_st)
        lines.append(f"stages     per task: mean {mean}, min {lo}, max {hi}")
        mean, lo, hi = _mmm(depth)
        lines.append(f"depth      stages on the longest path: mean {mean}, min {lo}, max {hi}")
        wf: dict[str, int] = {}
        for x in tasks:
            wf[x.workflow] = wf.get(x.workflow, 0) + 1
        lines.append("workflows  " + ", ".join(f"{k or '(none)'}: {wf[k]}" for k in sorted(wf)))
    calls: dict[str, list[tuple[int, int]]] = {a: [] for a in t.agents}
    for x in tasks:
        for s in x.stages:
            calls[s.agent].append((s.input_tokens, s.output_tokens))
    header = ("agent", "calls", "prefix", "exp.out", "in.mean", "in.min", "in.max",
              "out.mean", "out.min", "out.max")
    rows = []
    for name, a in t.agents.items():
        xs = [c[0] for c in calls[name]]
        ys = [c[1] for c in calls[name]]
        rows.append((name, str(len(xs)), str(a.prefix_tokens), f"{a.expected_output_tokens:g}",
                     *_mmm(xs), *_mmm(ys)))
    total_prefix = sum(a.prefix_tokens for a in t.agents.values())
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))

    lines.append("")
    lines.append(fmt(header))
    lines.extend(fmt(r) for r in rows)
    lines.append(f"sum of prefixes: {total_prefix} tokens")
    return lines


@trace.command("describe")
@click.argument("file", type=click.Path(path_type=Path))
def trace_describe(file: Path) -> None:
    """Summarize FILE: tasks, requests, arrivals, DAG sizes and per-agent token statistics."""
    t = _load(file)
    click.echo("\n".join(describe_lines(t, str(file))))


if __name__ == "__main__":  # pragma: no cover
    main()
