"""``topas simulate``: one experiment on the simulator (or a cluster of them), its summary printed
and, with ``--out``, its tables and inputs written.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

import click

from topas.cli.group import fail, main
from topas.cli_options import arrival_options, knowledge_options
from topas.out_dir import OutDirError, mark
from topas.out_dir import check_out_dir as check
from topas.provenance import environment


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def check_out_dir(out: Path | str, force: bool = False) -> Path:
    """Fail (exit 1, naming ``out``) unless the result tables can be written to ``out``: checked
    *before* simulating, so an unwritable folder does not lose the run, and a folder of other
    files is never replaced without ``--force`` (:func:`topas.out_dir.check_out_dir`)."""

    try:
        return check(out, "simulate", force)
    except OutDirError as e:
        fail(f"error: {e}")


def simulate_inputs(prepared) -> dict:
    """What ``topas simulate --out`` records beside the tables (``inputs.json``): the spec, the
    resolved inputs it ran with (trace file and sha256, rate, seed, tasks, policy parameters,
    profile and its hash), the experiment key and the environment (versions, commit, dirty flag)."""

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

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        result.to_parquet(tmp)
        mark(tmp, "simulate")
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
        f"prefixes     hits {s['prefix_hits']}, {_cached_pct(s)} of prompt tokens cached, "
        f"loads {s['prefix_loads_swap']} by swap + "
        f"{s['prefix_loads_prefill']} by prefill, evictions {s['prefix_evictions']}, "
        f"swapped {_fmt_bytes(s['bytes_swapped'])}",
        f"rework       recomputed {s['recomputed_tokens']:,} tokens; retractions {s['retractions']}, "
        f"preemptions {s['preemptions']}",
        f"plan         prefix copies {s['prefix_dup_copies']} ({s['prefix_dup_tokens']:,} tokens computed twice); "
        + (f"admitted {s['admitted']:,} of {s['planned_admits']:,} planned"
           if s.get("planned_admits") is not None else f"admitted {s['admitted']:,}")
        + f"; preemptions whose room went unused {s['preempt_unused']}",
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
    # lazy: loaded when the command runs, so `topas --help` stays fast
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
@click.option("--host-tier", type=click.Choice(["none", "hicache"]), default="none", is_flag=False,
              flag_value="hicache", show_default=True,
              help="The host (CPU) KV tier, for every policy: 'hicache' (SGLang HiCache; a bare --host-tier "
                   "means it): an evicted prefix is swapped out and back at the profile's bandwidth instead "
                   "of recomputed (EngineConfig.host_tier). 'none' is stock SGLang.")
@click.option("--eviction", default=None, metavar="NAME",
              help="The radix cache's eviction order, NAME or NAME:key=value,... (SGLang's "
                   "--radix-eviction-policy; `topas evictions` lists them) [default: lru].")
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
@click.option("--out", "out_arg", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Write the result tables to DIR/<table>.parquet and the inputs (trace, load, seed, "
                   "parameters, versions) to DIR/inputs.json, atomically; checked before simulating. A "
                   "non-empty DIR that is not an earlier `topas simulate` output is refused (see --force).")
@click.option("--force", is_flag=True,
              help="Replace --out DIR even when it holds other files (they are deleted).")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar on stderr [default: only when stderr is a terminal].")
def simulate_cmd(trace_name: str, policy: str, params: tuple[str, ...], rate: float | None,
                 load: float | None, seed: int, n_tasks: int | None, profile: str | None,
                 kv_budget: int | None, host_tier: str, eviction: str | None, engine_opts: tuple[str, ...],
                 n_engines: int,
                 router: str | None, router_params: tuple[str, ...], out_arg: str | None, force: bool,
                 progress: bool | None, **knowledge) -> None:
    """Simulate one trace under one policy and print a summary.

    Without --rate or --load the trace's own arrival times are used. Exit status 1 with a message
    naming the bad item for an unknown policy, parameter, profile or trace, a missing or invalid
    trace file, or a bad --param; 2 for a usage error (e.g. both --rate and --load).
    """
    if rate is not None and load is not None:
        raise click.UsageError("give either --rate or --load, not both")
    out = None if out_arg is None else check_out_dir(out_arg, force)  # before the minutes of simulating
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.engine.cost import DEFAULT_PROFILE, ProfileError
    from topas.engine.evict_pass import check_policy_eviction
    from topas.experiments.spec import Experiment, ExperimentError, prepare, run_prepared
    from topas.policies.base import PolicyError, parse_param_strings
    from topas.workload.validate import TraceError

    try:
        options = dict(parse_param_strings(engine_opts))
        if host_tier == "hicache":
            options["host_tier"] = True
        if eviction is not None:
            options["eviction"] = eviction
        exp = Experiment(
            workload=trace_name, policy=policy, params=parse_param_strings(params),
            profile=profile or DEFAULT_PROFILE, rate=rate, load=load, seed=seed, n_tasks=n_tasks,
            kv_budget=kv_budget, engine_options=options, engines=n_engines, router=router,
            router_params=parse_param_strings(router_params), **knowledge,
        )
        prepared = prepare(exp)
        check_policy_eviction(prepared.policy, prepared.config.eviction)
    except (ExperimentError, PolicyError, ProfileError, TraceError, FileNotFoundError) as e:
        fail(f"error: {e}")
    except UnicodeDecodeError:
        fail(f"error: --profile {profile}: not a profile file (not UTF-8 text)")
    except OSError as e:
        fail(f"error: {e.filename or trace_name}: cannot read: {e.strerror or e}")
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


def _cached_pct(summary: dict) -> str:
    """The share of prompt tokens served from the cache (the summary's ``cached_tokens`` /
    ``prompt_tokens``, as :func:`topas.engine.metrics.cached_share` sums them)."""
    total = summary.get("prompt_tokens") or 0
    return f"{100 * summary['cached_tokens'] / total:.1f}%" if total else "n/a"
