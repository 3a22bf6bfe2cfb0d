"""``topas trace validate`` and ``topas trace describe``: check a trace file and summarise it."""

from __future__ import annotations

import statistics
from pathlib import Path

import click

from topas.cli.group import fail, main
from topas.engine.cost import DEFAULT_PROFILE, load_profile


@main.group()
def trace() -> None:
    """Validate and describe workload traces (schema topas.trace/1, data/traces/README.md)."""


def _trace_file(file: Path) -> Path:
    """``file`` itself when it exists (or looks like a path), else the trace of that name in
    ``data/traces/`` (as ``simulate --trace`` resolves it); exit 1 listing the available traces."""
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.experiments.spec import ExperimentError, resolve_trace_path

    if file.exists():
        return file
    try:
        return resolve_trace_path(str(file))
    except ExperimentError as e:
        fail(f"error: {e}")
    except FileNotFoundError:
        fail(f"error: {file}: no such file")


def _load(file: Path, kv_budget: int | None = None):
    """Read a trace (a file or a trace name) or exit 1 with the reason (missing file, unreadable,
    invalid trace)."""
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.workload.trace_io import read_trace
    from topas.workload.validate import TraceError

    file = _trace_file(file)
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
              help="Check against this engine profile's KV budget [default: the default profile, "
                   "a100-80gb_qwen2.5-32b, which `topas simulate` uses].")
@click.option("--kv-budget", type=click.IntRange(min=1), metavar="N", default=None,
              help="Check against a KV budget of N tokens: prefixes and single requests must fit.")
def trace_validate(file: Path, profile: str | None, kv_budget: int | None) -> None:
    """Check FILE (a trace file or a name under data/traces/) against every rule of the trace
    schema and a KV budget; print a summary naming the budget checked, or the first error."""
    if profile is not None and kv_budget is not None:
        raise click.UsageError("give either --profile or --kv-budget, not both")
    budget_of = "--kv-budget"
    if kv_budget is None:
        budget_of = f"profile {profile}" if profile is not None else f"the default profile {DEFAULT_PROFILE}"
        profile = profile or DEFAULT_PROFILE
    if kv_budget is None:
        try:
            kv_budget = load_profile(profile).kv_budget_tokens
        except UnicodeDecodeError:
            fail(f"error: --profile {profile}: not a profile file (not UTF-8 text)")
        except ValueError as e:  # ProfileError
            fail(f"error: {e}")
    t = _load(file, kv_budget)
    click.echo(f"OK: {len(t.tasks)} tasks, {t.num_requests} requests, {len(t.agents)} agents "
               f"(fits the KV budget of {budget_of}: {kv_budget:,} tokens)")


def _mmm(values: list[int]) -> tuple[str, str, str]:
    if not values:
        return ("-", "-", "-")
    return (f"{statistics.fmean(values):.1f}", str(min(values)), str(max(values)))


def describe_lines(t, source: str = "") -> list[str]:
    """The ``topas trace describe`` report of a trace, as lines."""
    # lazy: loaded when the command runs, so `topas --help` stays fast
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
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.workload.reuse import reuse_lines

    lines.extend(reuse_lines(t))
    return lines


@trace.command("describe")
@click.argument("file", type=click.Path(path_type=Path))
def trace_describe(file: Path) -> None:
    """Summarize FILE (a trace file or a name under data/traces/, e.g. dag-4): tasks, requests,
    arrivals, DAG sizes and per-agent token statistics."""
    t = _load(file)
    click.echo("\n".join(describe_lines(t, str(_trace_file(file)))))
