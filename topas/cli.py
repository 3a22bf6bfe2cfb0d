"""The ``topas`` command line.

``topas`` is a click group; each area adds a subgroup or command to :data:`main`::

    topas --version
    topas trace validate FILE_OR_NAME [--profile NAME | --kv-budget N]
    topas trace describe FILE_OR_NAME
    topas simulate --trace NAME_OR_FILE --policy NAME [--param K=V ...] [--rate R | --load X] ...
    topas simulate ... --engines N --router NAME [--router-param K=V ...]   (a cluster)
    topas policies
    topas routers
    topas capacity WORKLOAD [WORKLOAD...] [--policies P1,P2] [--tasks N] [--seed S] [--load-sat X]

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
from topas.cli_options import arrival_options, knowledge_options


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


def _trace_file(file: Path) -> Path:
    """``file`` itself when it exists (or looks like a path), else the trace of that name in
    ``data/traces/`` (as ``simulate --trace`` resolves it); exit 1 listing the available traces."""
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
        from topas.engine.cost import DEFAULT_PROFILE

        budget_of = f"profile {profile}" if profile is not None else f"the default profile {DEFAULT_PROFILE}"
        profile = profile or DEFAULT_PROFILE
    if kv_budget is None:
        try:
            from topas.engine.cost import load_profile
        except ImportError as e:  # pragma: no cover - only before the engine exists
            fail(f"error: --profile needs topas.engine.cost, which cannot be imported: {e}")
        try:
            kv_budget = load_profile(profile).kv_budget_tokens
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


# ----------------------------------------------------------------------------- topas simulate


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def check_out_dir(out: Path) -> None:
    """Fail (exit 1, naming ``out``) unless the result tables can be written to ``out``: checked
    *before* simulating, so an unwritable folder does not lose the run."""
    import tempfile

    if out.exists() and not out.is_dir():
        fail(f"error: --out {out}: exists and is not a directory")
    base = out
    while not base.exists():
        if base.parent == base:
            break
        base = base.parent
    if not base.is_dir():
        fail(f"error: --out {out}: {base} is not a directory")
    try:
        tempfile.TemporaryDirectory(prefix=".topas-write-check-", dir=base).cleanup()
    except OSError as e:
        fail(f"error: --out {out}: cannot write in {base}: {e.strerror or e}")


def simulate_inputs(prepared) -> dict:
    """What ``topas simulate --out`` records beside the tables (``inputs.json``): the spec, the
    resolved inputs it ran with (trace file and sha256, rate, seed, tasks, policy parameters,
    profile and its hash), the experiment key and the environment (versions, commit, dirty flag)."""
    import dataclasses

    from topas.provenance import environment

    exp = prepared.experiment
    canonical = exp.canonical()
    return {
        "schema": "topas.simulate-inputs/1",
        "command": " ".join(["topas", *sys.argv[1:]]),
        "experiment": exp.fields(),
        "label": exp.label(),
        "key": exp.key(),
        "trace": {"name": prepared.trace.name, "path": str(prepared.trace_path),
                  "sha256": canonical["trace_sha256"], "nominal_rate": prepared.nominal_rate},
        "rate": prepared.rate,
        "load": exp.load,
        "seed": exp.seed,
        "n_tasks": exp.n_tasks,
        "policy": exp.policy,
        "params": dataclasses.asdict(prepared.policy.params),
        "profile": {"name": prepared.cost.name, "hash": canonical["profile_hash"],
                    "kv_budget_tokens": prepared.cost.kv_budget_tokens},
        "engine": exp.engine,
        **({"cluster": {"engines": exp.engines, "router": exp.router,
                        "router_params": dataclasses.asdict(prepared.router.params)}} if exp.is_cluster else {}),
        "canonical": canonical,
        "environment": environment(),
    }


def write_out_dir(out: Path, result, inputs: dict) -> None:
    """Write the tables and ``inputs.json`` into ``out`` atomically: all of them into a temporary
    folder beside it, then one rename (an ``out`` already there is replaced only once the new one
    is complete)."""
    import json
    import shutil
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        result.to_parquet(tmp)
        (tmp / "inputs.json").write_text(json.dumps(inputs, indent=1, default=str) + "\n")
        old = None
        if out.exists():
            old = out.parent / f"{tmp.name}.old"
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def simulate_summary_lines(prepared, result, out: Path | None = None) -> list[str]:
    """The one-screen report of ``topas simulate`` (a :class:`topas.experiments.spec.Prepared`
    and the :class:`topas.engine.metrics.SimResult` of running it)."""
    exp, s, trace = prepared.experiment, result.summary, prepared.trace
    params = "  ".join(f"{k}={v}" for k, v in exp.params) or "(default parameters)"
    nominal = prepared.nominal_rate
    if prepared.rate is None:
        arrivals = "the trace's own arrival times" + (f" (nominal {nominal:g} tasks/s)" if nominal else "")
    else:
        process = "Poisson" if exp.arrivals == "poisson" else f"gamma renewal (CV {exp.arrivals.split(':')[1]})"
        if exp.load is not None:
            arrivals = f"{process} {prepared.rate:.4g} tasks/s = load {exp.load:g} x nominal {nominal:g}, seed {exp.seed}"
        else:
            arrivals = f"{process} {prepared.rate:.4g} tasks/s, seed {exp.seed}"
    budget = prepared.cost.kv_budget_tokens
    override = " (--kv-budget)" if exp.kv_budget is not None else ""
    lines = [
        f"workload     {trace.name}  ({prepared.trace_path})",
        f"policy       {exp.policy}  {params}",
        f"profile      {prepared.cost.name}  (KV budget {budget:,} tokens{override})",
        f"engine       simulator, {exp.engine_model} SGLang behaviours"
        + ("" if prepared.config.host_tier else " (no host KV tier)"),
        f"arrivals     {arrivals}",
        *([f"knowledge    " + "  ".join(f"{k}={v}" for k, v in prepared.knowledge.settings().items())]
          if prepared.knowledge is not None and not prepared.knowledge.is_default else []),
        f"tasks        {s['n_tasks']} tasks, {s['n_requests']} requests" + _head_note(exp.n_tasks, prepared),
        f"JCT (s)      mean {s['jct_mean']:.2f}   p50 {s['jct_p50']:.2f}   p90 {s['jct_p90']:.2f}   "
        f"p99 {s['jct_p99']:.2f}",
        f"throughput   {s['throughput_rps']:.4g} requests/s, {s['throughput_tps']:.4g} tasks/s "
        f"(makespan {s['makespan']:.1f} s)",
        f"batching     avg decode batch {s['avg_decode_batch']:.2f} over {s['decode_steps']:,} decode steps; "
        f"mean KV use {100 * s['kv_util_mean']:.1f}%",
        f"prefixes     hits {s['prefix_hits']}, loads {s['prefix_loads_swap']} by swap + "
        f"{s['prefix_loads_prefill']} by prefill, evictions {s['prefix_evictions']}, "
        f"swapped {_fmt_bytes(s['bytes_swapped'])}",
        f"rework       recomputed {s['recomputed_tokens']:,} tokens; retractions {s['retractions']}, "
        f"preemptions {s['preemptions']}",
        *cluster_lines(prepared, s),
        f"decisions    {s['n_decisions']:,}, mean {s['decision_wall_mean_ms']:.3f} ms wall "
        f"(p99 {s['decision_wall_p99_ms']:.3f} ms), {100 * s['decision_wall_share']:.3f}% of simulated time",
        f"wall time    {s['sim_wall_s']:.2f} s to simulate",
    ]
    if out is not None:
        extra = ",engines,prefix_copies" if exp.is_cluster else ""
        lines.append(f"written      {out}/{{tasks,requests,prefix_events,timeline,decisions,summary{extra}}}.parquet "
                     "+ inputs.json")
    return lines


def cluster_lines(prepared, s: dict) -> list[str]:
    """The cluster's lines of the ``topas simulate`` report (none for a single engine)."""
    exp = prepared.experiment
    if not exp.is_cluster:
        return []
    rp = "  ".join(f"{k}={v}" for k, v in exp.router_params) or "(default parameters)"
    return [
        f"cluster      {exp.engines} engines x {exp.policy}, router {exp.router}  {rp}",
        f"balance      requests per engine {s['requests_per_engine_min']}..{s['requests_per_engine_max']}, "
        f"CV {s['requests_per_engine_cv']:.3f}",
        f"copies       engines holding an agent's prefix: mean {s['prefix_copies_mean']:.2f} over time, "
        f"max {s['prefix_copies_max']}, {s['prefix_copies_end']:.2f} at the end",
        *([f"router hold  requests waited {s['router_hold_mean']:.3f} s on average in the router before it sent them"]
          if prepared.router.holds else []),
    ]


def _head_note(n_tasks: int | None, prepared) -> str:
    """``(first N of the trace)``, or ``(all N: --tasks asked for M)`` when the trace is shorter."""
    if n_tasks is None:
        return ""
    from topas.experiments.spec import _read_trace

    total = len(_read_trace(prepared.trace_path).tasks)
    if n_tasks >= total:
        return f" (the whole trace: it has {total} tasks, --tasks asked for {n_tasks})"
    return f" (first {n_tasks} of the trace's {total})"


@main.command("simulate")
@click.option("--trace", "trace_name", required=True, metavar="NAME_OR_FILE",
              help="A trace name under data/traces/ (chain-3, dag-4, ...) or a trace file.")
@click.option("--policy", required=True, metavar="NAME", help="The scheduler (`topas policies` lists them).")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="A policy parameter, e.g. --param beta=0.5 (repeatable).")
@arrival_options("Simulate")
@knowledge_options
@click.option("--profile", default=None, metavar="NAME",
              help="Engine profile name under data/profiles/ or a profile file [default: a100-80gb_qwen2.5-32b].")
@click.option("--kv-budget", type=click.IntRange(min=1), default=None, metavar="N",
              help="Override the profile's KV budget (tokens).")
@click.option("--host-tier", is_flag=True, default=False,
              help="Model a host (CPU) KV tier for every policy (SGLang HiCache): an evicted prefix is "
                   "swapped out and back at the profile's bandwidth instead of recomputed. Off in stock SGLang.")
@click.option("--engine-option", "engine_opts", multiple=True, metavar="K=V",
              help="An engine behaviour switch, e.g. --engine-option admission_gate=false (repeatable; "
                   "see topas.engine.config.EngineConfig).")
@click.option("--engines", "n_engines", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Simulate N identical engines of the profile behind --router, each with its own instance "
                   "of the policy (docs/cluster.md).")
@click.option("--router", default=None, metavar="NAME",
              help="The router of a cluster (`topas routers` lists them); required with --engines > 1.")
@click.option("--router-param", "router_params", multiple=True, metavar="K=V",
              help="A router parameter, e.g. --router-param cache_threshold=0.5 (repeatable).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="Write the result tables to DIR/<table>.parquet and the inputs (trace, load, seed, "
                   "parameters, versions) to DIR/inputs.json, atomically; checked before simulating.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar on stderr [default: only when stderr is a terminal].")
def simulate_cmd(trace_name: str, policy: str, params: tuple[str, ...], rate: float | None,
                 load: float | None, seed: int, n_tasks: int | None, profile: str | None,
                 kv_budget: int | None, host_tier: bool, engine_opts: tuple[str, ...], n_engines: int,
                 router: str | None, router_params: tuple[str, ...], out: Path | None,
                 progress: bool | None, **knowledge) -> None:
    """Simulate one trace under one policy and print a summary.

    Without --rate or --load the trace's own arrival times are used. Exit status 1 with a message
    naming the bad item for an unknown policy, parameter, profile or trace, a missing or invalid
    trace file, or a bad --param; 2 for a usage error (e.g. both --rate and --load).
    """
    if rate is not None and load is not None:
        raise click.UsageError("give either --rate or --load, not both")
    from topas.engine.cost import DEFAULT_PROFILE, ProfileError
    from topas.experiments.spec import Experiment, ExperimentError, prepare, run_prepared
    from topas.policies.base import PolicyError, parse_param_strings
    from topas.workload.validate import TraceError

    try:
        options = dict(parse_param_strings(engine_opts))
        if host_tier:
            options["host_tier"] = True
        exp = Experiment(
            workload=trace_name, policy=policy, params=parse_param_strings(params),
            profile=profile or DEFAULT_PROFILE, rate=rate, load=load, seed=seed, n_tasks=n_tasks,
            kv_budget=kv_budget, engine_options=options, engines=n_engines, router=router,
            router_params=parse_param_strings(router_params), **knowledge,
        )
        prepared = prepare(exp)
    except (ExperimentError, PolicyError, ProfileError, TraceError, FileNotFoundError) as e:
        fail(f"error: {e}")
    except OSError as e:
        fail(f"error: {trace_name}: cannot read: {e.strerror or e}")
    if out is not None:
        check_out_dir(out)
    if progress is None:
        progress = sys.stderr.isatty()
    result = run_prepared(prepared, progress=progress)
    lines = simulate_summary_lines(prepared, result, out)
    if out is not None:
        try:
            write_out_dir(out, result, simulate_inputs(prepared))
        except OSError as e:  # the summary is printed all the same: the run is not lost
            click.echo("\n".join(lines[:-1]))
            fail(f"error: cannot write the result tables to {out}: {e.strerror or e}")
    click.echo("\n".join(lines))


# ----------------------------------------------------------------------------- topas capacity


@main.command("capacity")
@click.argument("workloads", nargs=-1, required=True, metavar="WORKLOAD [WORKLOAD...]")
@click.option("--policies", default="fcfs,lpm,spf,parrot-fcfs,autellix-las,topas", metavar="P1,P2,...",
              show_default=True, help="Comma-separated policies to measure.")
@click.option("--tasks", "n_tasks", type=click.IntRange(min=8), default=None, metavar="N",
              help="Tasks per run [default: 200; more resolves marginal overload better].")
@click.option("--seed", "seeds", type=int, multiple=True, default=(0,), show_default=True,
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


# ----------------------------------------------------------------------------- topas policies


def policies_lines() -> list[str]:
    """The ``topas policies`` listing: each policy, its one-line description and its parameters."""
    from topas.policies.base import available_policies, policy_class

    lines: list[str] = []
    for name in available_policies():
        cls = policy_class(name)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        head = doc[0].strip() if doc else ""
        fixed = dict(getattr(cls, "FIXED", {}) or {})
        prefixes = "manages prefixes" if cls.manages_prefixes else "engine manages prefixes (LRU)"
        lines.append(f"{name}  [{prefixes}]" + (f"  {head}" if head else ""))
        lines += params_lines(cls.Params, fixed)
    return lines


def params_lines(params: type, fixed: dict | None = None) -> list[str]:
    """``    name: type = default`` for each field of a parameters dataclass (``fixed``: values an
    ablation fixes, marked so), or ``    (no parameters)``: the body of ``topas policies`` and
    ``topas routers``."""
    import dataclasses
    import typing

    fixed = fixed or {}
    fields = dataclasses.fields(params)
    hints = typing.get_type_hints(params)
    lines = [] if fields else ["    (no parameters)"]
    for f in fields:
        typ = hints.get(f.name, f.type)
        if typing.get_origin(typ) is typing.Literal:
            tname = " | ".join(repr(c) for c in typing.get_args(typ))
        else:
            tname = getattr(typ, "__name__", None) or str(typ).replace("typing.", "")
        if f.name in fixed:
            lines.append(f"    {f.name}: {tname} = {fixed[f.name]!r}  (fixed by this ablation)")
        else:
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            lines.append(f"    {f.name}: {tname} = {default!r}")
    return lines


@main.command("policies")
def policies_cmd() -> None:
    """List the policies with their parameters (name: type = default); set them with --param."""
    click.echo("\n".join(policies_lines()))


def routers_lines() -> list[str]:
    """The ``topas routers`` listing: each router, its one-line description and its parameters."""
    from topas.cluster.routers import available_routers, router_class

    lines: list[str] = []
    for name in available_routers():
        cls = router_class(name)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        head = doc[0].strip() if doc else ""
        head = head.removeprefix(f"``{name}``:").strip()
        lines.append(f"{name}" + (f"  {head}" if head else ""))
        lines += params_lines(cls.Params)
    return lines


@main.command("routers")
def routers_cmd() -> None:
    """List the routers of a cluster with their parameters (name: type = default); use them with
    `topas simulate --engines N --router NAME --router-param K=V`."""
    click.echo("\n".join(routers_lines()))



# ----------------------------------------------------------------------------- topas profile-server / fidelity


@main.command("profile-server")
@click.option("--server", required=True, metavar="URL", help="A running SGLang server, e.g. http://127.0.0.1:30000.")
@click.option("--out", required=True, type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="The profile to write, e.g. data/profiles/cpu_tiny-llama.json.")
@click.option("--name", default=None, help="The profile's name [default: the file name without .json].")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Measurements per point (the median is fitted).")
@click.option("--quick", is_flag=True, help="A small grid (for tests).")
@click.option("--device", default="", help="What the server runs on, for the profile's 'gpu.name' (e.g. 'A100-80GB').")
def profile_server_cmd(server: str, out: Path, name: str | None, repeats: int, quick: bool, device: str) -> None:
    """Measure a running SGLang server (prefill vs new/cached tokens, decode step vs batch and KV,
    per-iteration floors) and write a fitted profile (topas.profile/1) with its fit error."""
    from topas.fidelity.profile_server import ServerError, profile_server

    try:
        profile_server(server, out, name=name, quick=quick, repeats=repeats,
                       log=lambda m: click.echo(m, err=True), device=device)
    except (ServerError, ValueError) as e:
        fail(f"error: {e}")


@main.command("fidelity")
@click.option("--trace", "traces", required=True, multiple=True, metavar="NAME_OR_FILE", help="A trace (repeatable).")
@click.option("--policies", required=True, metavar="P1,P2", help="Comma-separated policies, e.g. fcfs,lpm,topas.")
@click.option("--rates", default=None, metavar="R1,R2", help="Arrival rates (tasks/s), comma-separated.")
@click.option("--loads", default=None, metavar="X1,X2", help="Multiples of each trace's nominal rate, comma-separated.")
@click.option("--seeds", default="0", show_default=True, metavar="S1,S2", help="Arrival seeds, comma-separated.")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Measured runs per point (the simulator runs once: it is deterministic); on a CPU one run "
                   "lies ~10% from the others, so the 90% interval of a 5-run mean is about +-14%.")
@click.option("--tasks", "n_tasks", type=click.IntRange(min=1), default=None, metavar="N", help="The first N tasks of each trace.")
@click.option("--server", required=True, metavar="URL", help="The SGLang server to replay on.")
@click.option("--profile", required=True, metavar="NAME_OR_FILE", help="The server's measured profile (topas profile-server).")
@click.option("--kv-budget", type=click.IntRange(min=1), default=None, metavar="N",
              help="The server's KV budget [default: asked from the server, else the profile's].")
@click.option("--param", "params", multiple=True, metavar="K=V", help="A policy parameter (repeatable).")
@click.option("--bars", type=click.Choice(["benchmark", "ci"]), default="benchmark", show_default=True,
              help="benchmark: mean 15%, p99 25%, cached 10%; ci: mean 30%, cached 10%.")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Where the comparison goes (runs/comparison/ranks/tasks .csv, meta.json, comparison.md, raw/).")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Probe the server's speed around every run and also simulate with the profile rescaled to it.")
@click.option("--engine-model", type=click.Choice(["sglang", "legacy"]), default="sglang", show_default=True,
              help="sglang: the simulator as configured for the server (stock SGLang's behaviours, ignore_eos "
                   "requests, the profile's request path); legacy: the same with the engine model of the figures "
                   "before issue 12 (topas.engine.config.LEGACY_ENGINE).")
@click.option("--decision-log", default=None, metavar="FILE",
              help="The server's TOPAS_DECISION_LOG when readable here (fills per-request queueing).")
@click.option("--check/--no-check", default=False, help="Exit 3 if a bar or a rank check fails.")
def fidelity_cmd(traces, policies, rates, loads, seeds, repeats, n_tasks, server, profile, kv_budget, params,
                 bars, out, calibrate, engine_model, decision_log, check) -> None:
    """Replay traces on a real server and simulate them with the server's profile; compare."""
    from topas.fidelity import compare as fc
    from topas.fidelity.run import (fidelity_points, replay_measure, run_fidelity, server_kv_settings, sim_engine,
                                    speed_probe)
    from topas.policies.base import PolicyError, parse_param_strings

    if (rates is None) == (loads is None):
        raise click.UsageError("give exactly one of --rates and --loads")
    try:
        pts = fidelity_points(traces, [p for p in policies.split(",") if p], rates=rates, loads=loads,
                              seeds=seeds, n_tasks=n_tasks, params=parse_param_strings(params))
        settings = server_kv_settings(server)
        probe = speed_probe(server, sim_engine(profile, kv_budget, settings)[0]) if calibrate else None
        comp = run_fidelity(pts, replay_measure(server, decision_log=decision_log), profile, out, repeats=repeats,
                            kv_budget=kv_budget, settings=settings,
                            bars=fc.CI_BARS if bars == "ci" else fc.BENCHMARK_BARS,
                            meta={"server": server, "command": " ".join(sys.argv)},
                            log=lambda m: click.echo(m, err=True), probe=probe, engine_model=engine_model)
    except (ValueError, PolicyError, RuntimeError, FileNotFoundError) as e:
        fail(f"error: {e}")
    click.echo("\n".join(fc.verdict_lines(comp)))
    click.echo(f"written      {out}/{{runs,comparison,ranks,tasks}}.csv, meta.json, comparison.md")
    if check and not comp.passed:
        sys.exit(3)


# ----------------------------------------------------------------------------- topas serve / replay (SGLang)

from topas.sglang.cli import replay_cmd, serve_cmd  # noqa: E402  (imports no sglang)

main.add_command(serve_cmd)
main.add_command(replay_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()
