"""``topas profile-server`` and ``topas fidelity``: profile a real SGLang server, compare the
simulator with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from topas.cli.group import fail, main
from topas.out_dir import OutDirError, check_out_file


@main.command("profile-server")
@click.option("--server", required=True, metavar="URL", help="A running SGLang server, e.g. http://127.0.0.1:30000.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="The profile to write, e.g. data/profiles/cpu_tiny-llama.json.")
@click.option("--name", default=None, help="The profile's name [default: the file name without .json].")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Measurements per point (the median is fitted).")
@click.option("--quick", is_flag=True, help="A small grid (for tests).")
@click.option("--device", default="", help="What the server runs on, for the profile's 'gpu.name' (e.g. 'A100-80GB').")
@click.option("--force", is_flag=True, help="Overwrite --out FILE even when it is not an earlier profile.")
def profile_server_cmd(server: str, out: Path, name: str | None, repeats: int, quick: bool, device: str,
                       force: bool) -> None:
    """Measure a running SGLang server (prefill vs new/cached tokens, decode step vs batch and KV,
    per-iteration floors) and write a fitted profile (topas.profile/1) with its fit error. An
    existing --out FILE that is not a profile is refused before measuring (see --force)."""
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.fidelity.profile_server import ServerError, profile_server

    try:
        out = check_out_file(out, "topas.profile/", force)
    except OutDirError as e:
        fail(f"error: {e}")

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
@click.option("--out", required=True, type=click.Path(file_okay=False), metavar="DIR",
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
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.fidelity import compare as fc
    from topas.fidelity.run import (
        fidelity_points,
        replay_measure,
        run_fidelity,
        server_kv_settings,
        sim_engine,
        speed_probe,
    )
    from topas.policies.base import PolicyError, parse_param_strings

    if (rates is None) == (loads is None):
        raise click.UsageError("give exactly one of --rates and --loads")
    if not out.strip():
        fail("error: --out is empty: give the folder to write the comparison to")
    out = Path(out)
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
