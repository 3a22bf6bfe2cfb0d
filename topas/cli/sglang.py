"""``topas serve`` and ``topas replay`` (attached to the ``topas`` group in topas/cli/__init__.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from topas.cli_options import arrival_options, knowledge_options
from topas.out_dir import OutDirError, check_out_dir

#: Exit status of a refused or unreachable server (as ``scripts/reproduce.py``'s).
EXIT_SERVER = 3


def _fail(message: str, status: int = 1):
    click.echo(message, err=True)
    sys.exit(status)


@click.command("serve", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--policy", default="topas", show_default=True, metavar="NAME",
              help="The policy the SGLang scheduler runs (`topas policies` lists them).")
@click.option("--param", "params", multiple=True, metavar="K=V", help="A policy parameter (repeatable).")
@click.option("--profile", default=None, metavar="NAME",
              help="Cost-model profile the policy uses (its KV budget is replaced by the server's).")
@click.option("--decision-log", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Append every decision, admission and pin change to FILE (JSON lines).")
@click.option("--python", "python", default=None, metavar="PY",
              help="The Python that has sglang installed [default: this one].")
@click.option("--dummy-weights", "dummy", default=None, metavar="MODEL",
              help="Serve a model config shipped in data/models/ (e.g. qwen2.5-32b-instruct) with random "
                   "weights and no tokenizer: nothing to download (adds --model-path, --load-format dummy, "
                   "--skip-tokenizer-init).")
@click.option("--cpu-test", "cpu_test", is_flag=True,
              help="Start the CPU stand-in for a GPU server (docs/gpu.md): the tiny model of `make test-sglang` on "
                   "127.0.0.1 with a 16,384-token context and a 32,768-token KV pool, in .venvs/sglang-cpu's "
                   "Python; `-- --port N` picks the port (default 30000).")
@click.option("--dry-run", is_flag=True, help="Print the environment and command instead of starting.")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(policy, params, profile, decision_log, python, dummy, cpu_test, dry_run, sglang_args):
    """Start an SGLang server whose scheduler runs a topas policy.

    Everything after `--` goes to `python -m sglang.launch_server`, e.g.
    `topas serve --policy topas --param beta=0.5 -- --model-path Qwen/Qwen2.5-32B-Instruct --port 30000`,
    or without weights: `topas serve --dummy-weights qwen2.5-32b-instruct -- --port 30000 --enable-metrics`.
    A replay may still name another policy per run (`topas replay --policy`).
    """
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.policies.base import PolicyError, parse_param_strings
    from topas.sglang.launcher import dummy_weight_args, launch_command, server_env

    if dummy:
        if "--model-path" in sglang_args:
            _fail("error: give either --dummy-weights or SGLang's --model-path, not both")
        try:
            sglang_args = (*dummy_weight_args(dummy), *sglang_args)
        except ValueError as e:
            _fail(f"error: {e}")

    try:
        env = server_env(policy, parse_param_strings(params), profile=profile,
                         decision_log=os.path.abspath(decision_log) if decision_log else None)
    except PolicyError as e:
        _fail(f"error: {e}")
    if cpu_test:
        # lazy: loaded when the command runs, so `topas --help` stays fast
        from topas.paths import REPO_ROOT
        from topas.sglang.launcher import cpu_standin_args, cpu_standin_env, tiny_model_dir

        if dummy or "--model-path" in sglang_args:
            _fail("error: --cpu-test serves the tiny CPU model; give no --dummy-weights or --model-path")
        rest, port = list(sglang_args), 30000
        if "--port" in rest:
            k = rest.index("--port")
            port = int(rest[k + 1])
            del rest[k:k + 2]
        model = tiny_model_dir()
        if not (model / "config.json").is_file() and not dry_run:
            _fail(f"error: {model} has no config.json: build the CPU environment first "
                  f"(bash tools/sglang_cpu/build_env.sh, which make test-sglang runs)")
        sglang_args = (*cpu_standin_args(model, port), *rest)
        env = cpu_standin_env(env)
        venv_py = REPO_ROOT / ".venvs" / "sglang-cpu" / "bin" / "python"
        python = python or (str(venv_py) if venv_py.exists() else None)
    cmd = launch_command(list(sglang_args), python)
    if dry_run:
        for k in ("SGLANG_PLUGINS", "TOPAS_POLICY", "TOPAS_POLICY_PARAMS", "TOPAS_PROFILE", "TOPAS_DECISION_LOG",
                  "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "OMP_NUM_THREADS"):
            if k in env:
                click.echo(f"{k}={env[k]}")
        click.echo(" ".join(cmd))
        return
    os.execvpe(cmd[0], cmd, env)


@click.command("replay")
@click.option("--trace", "trace_name", required=True, metavar="NAME_OR_FILE", help="A trace name or file.")
@click.option("--policy", default="topas", show_default=True, metavar="NAME",
              help="The policy of this run (sent to the server's plugin in the request metadata).")
@click.option("--param", "params", multiple=True, metavar="K=V", help="A policy parameter (repeatable).")
@arrival_options("Replay")
@knowledge_options
@click.option("--server", required=True, metavar="URL",
              help="The SGLang server, e.g. http://127.0.0.1:30000, or an sglang-router in front of several; "
                   "every server must run the topas plugin (checked first).")
@click.option("--out", type=click.Path(file_okay=False), required=True, metavar="DIR",
              help="Write the result tables (the simulator's format) to DIR/<table>.parquet. A non-empty DIR "
                   "that is not an earlier `topas replay` output is refused (see --force).")
@click.option("--force", is_flag=True, help="Replace --out DIR even when it holds other files (they are deleted).")
@click.option("--decision-log", "decision_logs", type=click.Path(dir_okay=False), multiple=True, metavar="FILE",
              help="The server's decision log, if readable here (fills decisions and admissions); "
                   "behind a router, one per worker (repeat the option).")
@click.option("--send-text", is_flag=True,
              help="Send prompts as text (one character per token id: topas.sglang.text) instead of token ids, "
                   "for a router that routes on text (sglang-router's cache_aware); the servers must load the "
                   "matching tokenizer (not --skip-tokenizer-init).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=3600, show_default=True,
              help="Give up (exit 1, nothing written) after this many seconds.")
@click.option("--server-policy", is_flag=True,
              help="Do not send the policy; the server's `topas serve --policy` decides.")
@click.option("--eviction-priority", "eviction_priority", default="none", show_default=True, metavar="RULE",
              help="Send each request a top-level `priority` from RULE (topas.sglang.priority: none = send "
                   "nothing; policy = the policy's request_priority hook; steps = KVFlow's steps-to-execution "
                   "when installed), for a server with --radix-eviction-policy priority.")
def replay_cmd(trace_name, policy, params, rate, load, seed, n_tasks, server, out, force, decision_logs, send_text,
               timeout_s, server_policy, eviction_priority, **knowledge):
    """Replay a trace against a running SGLang server (with the topas plugin) and write the results.

    Exit status 3 within seconds if the server is unreachable, its URL has no http://, it (or a
    router's worker) does not run the topas plugin or cannot run the policy, or the client's
    aiohttp is missing; 1, with nothing written, if a request fails or the run times out.
    """
    if rate is not None and load is not None:
        raise click.UsageError("give either --rate or --load, not both")

    try:
        out = check_out_dir(out, "replay", force)
    except OutDirError as e:
        _fail(f"error: {e}")
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.sglang import server as srv
    from topas.sglang.client import ReplayError, require_client

    try:  # the checks reproduce.py makes, before anything else: exit 3 within seconds
        require_client()
        srv.preflight(server, () if server_policy else (policy,), timeout_s=min(10.0, timeout_s))
    except (ReplayError, srv.ServerError) as e:
        _fail(f"error: {e}", EXIT_SERVER)
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.cli.simulate import simulate_summary_lines
    from topas.engine.cost import ProfileError
    from topas.experiments.spec import Experiment, ExperimentError, prepare
    from topas.policies.base import PolicyError, parse_param_strings
    from topas.sglang.priority import make_rule
    from topas.sglang.replay import ReplayError, run_replay
    from topas.workload.validate import TraceError

    try:
        exp = Experiment(workload=trace_name, policy=policy, params=parse_param_strings(params), rate=rate,
                         load=load, seed=seed, n_tasks=n_tasks, **knowledge)
        prepared = prepare(exp)
        make_rule(eviction_priority, prepared.policy)  # an unknown rule fails before the replay
    except (ExperimentError, PolicyError, ProfileError, TraceError, FileNotFoundError, ValueError) as e:
        _fail(f"error: {e}")
    try:
        decision_log = None if not decision_logs else decision_logs[0] if len(decision_logs) == 1 else list(decision_logs)
        result = run_replay(prepared, server, decision_log=decision_log, out=out, timeout_s=timeout_s,
                            send_policy=not server_policy, wait_healthy_s=min(60.0, timeout_s), send_text=send_text,
                            eviction_priority=eviction_priority)
    except ReplayError as e:
        _fail(f"error: replay failed, nothing written: {e}")
    except KeyboardInterrupt:
        _fail("interrupted: the replay was stopped, nothing written")
    lines = simulate_summary_lines(prepared, result, out)
    if server_policy:  # the server's own policy ran it: print the label the result is stored under
        lines = [f"policy       {result.summary['policy']}  (the server's policy, --server-policy)"
                 if ln.startswith("policy ") else ln for ln in lines]
    lines[-2 if out else -1] = f"wall time    {result.summary['sim_wall_s']:.2f} s (replay on {server})"
    click.echo("\n".join(lines))
    click.echo(json.dumps({"run_id": result.summary["run_id"], "cached_tokens": result.summary["cached_tokens"]}))
