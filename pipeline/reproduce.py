"""The one reproduction driver (``make reproduce`` / ``make figures`` call it).

It runs the synthetic-workload comparison table, then executes the notebooks
(``notebooks/NN_*.ipynb``, in order, through papermill; ``--no-notebooks`` skips them; a failure
names the notebook and cell). The table: every synthetic workload
(chain-3, dag-4, dag-10-wide) under every registered policy, at ``--load`` times each trace's
nominal arrival rate (``meta["rate"]``; default 1.2, where the queue builds up), for ``--seeds``
arrival seeds (0, 1, ...) and the first ``--tasks`` tasks of each trace, on the simulator with
the default engine profile. It prints and writes a results table:

* per workload and policy: mean and p99 task JCT, each the mean over seeds with the spread
  across seeds (min-max);
* for ``topas`` (and, for reference, its ablations): the change against the best *baseline*,
  ``(policy - best) / best`` in percent, the best baseline chosen separately for each metric
  (as the paper does) among fcfs, lpm, spf, parrot-fcfs and autellix-las by the mean over seeds.
  Ablations (``topas-*``) and any other registered policy are shown but never count as a baseline;
* next to topas's change, the paper's reported reduction from ``data/paper/reported.csv``, labelled
  "paper (reported)": measured by the paper's authors on SGLang / A100, not by us, and never used
  to choose anything here.

Outputs (each written atomically: a temporary file, then a rename), in ``--out-dir``
(default ``figures/``):

* ``results_synthetic.csv``: the table, one row per workload and policy, numbers unrounded; with
  the run settings in columns, so ``--figures-only`` re-renders the Markdown from it alone;
* ``results_synthetic.md``: the table in Markdown, ready to paste into the README;
* ``results_synthetic_runs.csv``: one row per simulation (the raw per-seed summaries);
* ``results_synthetic_inputs.json``: what the table was made from: the settings, the workloads
  and policies, every run's experiment key, and the environment (Python and library versions,
  commit, dirty flag; :func:`topas.provenance.environment`).

On a GPU box (``--engine sglang``): ``--servers URL1,URL2,...`` (or ``--server URL``, or
``$TOPAS_SGLANG_URL``) names one or more identical SGLang servers running the topas plugin;
before anything runs, each is asked who it is and refused, in one line naming the fix, if it does
not run the plugin (:func:`topas.sglang.server.preflight`, the checks ``topas replay`` makes too).
Then the *plan* is printed (:mod:`topas.experiments.plan`): per stage (the table, the notebooks'
grids), the replays still to run (those stored are skipped), their arrivals, their drain as the
simulator predicts it and a per-replay overhead, and the wall time of all of them in one pool on
the given servers, which is how they then run: every replay of every workload and of the
notebooks' grids in one :func:`topas.experiments.run_many`, longest first, one per server at a
time (:mod:`topas.sglang.pool`); the notebooks then find them stored. Past ``--max-hours``
(default 1) of wall time the run stops there unless ``--yes`` is given (``make reproduce YES=1``);
``--plan`` prints the plan and stops. ``--grid gpu-afternoon``
(:func:`studies.grid.gpu_afternoon`, about 3 h of arrivals on one server) runs only that
grid and writes ``results_gpu_afternoon.{csv,md}`` to ``figures/sglang/gpu-afternoon/``; ``--tasks``
then caps every workload's task count (a smoke run). Every replay is stored as it finishes; a
restart resumes. Notebooks with nothing measured to show (01, 09-13, 15, 16) are not executed for
``--engine sglang``: ``figures/sglang/NOT_MEASURED.md`` says why.

On the simulator the plan (:mod:`topas.experiments.sim_plan`) gives the runs still to do, their
expected CPU time from a per-policy cost model measured on this machine (a short calibration run
of each policy, cached per code version) and the wall time on ``--jobs``. Ctrl-C (or a failed
replay) prints the command to resume as it was typed (``make reproduce ...`` sets
``$TOPAS_INVOKED_AS``; else this Python and the script).

Options: ``--quick`` (1 seed, 100 tasks unless given; the same as ``--grid quick``), ``--figures-only`` (re-renders the table
from ``results_synthetic.csv`` and re-executes the notebooks on stored results only: the working
store ``data/results/store``, then the results shipped in ``data/results/sim/``; nothing is
simulated, a missing result fails naming it). Without it the notebooks simulate every result the
working store lacks and ignore the shipped ones (``$TOPAS_USE_PACKS=0``); ``--engine sglang
--server URL`` replays every experiment on a running SGLang server instead of simulating
(one at a time; results stored under their own keys, labelled ``engine=sglang``; figures and
tables in ``figures/sglang/``),
``--jobs N`` (worker processes, also the notebooks' sweeps', through ``$TOPAS_JOBS``; default:
``$TOPAS_JOBS`` or all cores), ``--ray-address ADDR`` (run every sweep on a
Ray cluster instead of local processes: ``local``, ``auto`` or ``HOST:PORT``; it reaches the
notebooks through ``$TOPAS_RAY_ADDRESS``, see :mod:`topas.experiments.ray_backend`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

from pipeline.results_table import (AFTERNOON_TABLE, COLUMNS, TABLE, add_comparisons, aggregate,
                                             csv_text, emit, paper_reported, read_csv, sort_rows, write_atomic)
from topas.paths import REPO_ROOT as REPO
from topas.provenance import MEASURED_ON_ENV

GRIDS = ("full", "quick", "gpu-afternoon")
#: Notebooks with nothing measured on a server to show (trace statistics, the simulator-only
#: explorer, the CPU fidelity study, the simulated engine-model comparison): not executed for
#: --engine sglang, so figures/sglang/ holds measured results only.
NOT_MEASURED = {
    "01_workloads": "statistics of the traces, not of a run",
    "02_synthetic_jct": "the protocol's load grid (notebook 16's runs, about 1,600 to past capacity): days of arrivals on a server",
    "03_metagpt": "the protocol's load grid and the simulator's two cache models: simulator studies",
    "08_paper_vs_ours": "the paper's numbers beside the protocol's (notebook 16's grid and its ablation runs): a simulator study",
    "09_weights_explorer": "an interactive explorer that simulates",
    "10_fidelity": "the simulator against the CPU test server (make fidelity), not the GPU server",
    "11_engine_model": "compares two simulated engines; nothing runs on the server",
    "12_when_claims_hold": "a simulator study (capacity search, ~1,000 runs over the space of readings): days of arrivals on a server",
    "13_several_engines": "simulated clusters of 2-64 engines; real servers behind the real router are `make test-cluster`",
    "15_eviction": "the simulator's eviction orders and its offline bound (Belady, which reads the true future)",
    "16_protocol": "a simulator study (about 1,600 runs of a load grid to past capacity): days of arrivals on a server",
}
#: Exit status of a refused or unreachable server (one line on stderr).
EXIT_SERVER = 3

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("sim", "sglang"), default="sim", help="engine (default: sim)")
    ap.add_argument("--server", default=None,
                    help="the SGLang server URL for --engine sglang (default: $TOPAS_SGLANG_URL)")
    ap.add_argument("--servers", default=None, metavar="URL1,URL2,...",
                    help="several identical SGLang servers (one per GPU): one replay per server at a time")
    ap.add_argument("--grid", choices=GRIDS, default=None,
                    help="full (default), quick (= --quick) or gpu-afternoon (about 3 h of arrivals, --engine sglang)")
    ap.add_argument("--yes", action="store_true",
                    help="run even when the plan's wall time exceeds --max-hours (make reproduce YES=1)")
    ap.add_argument("--max-hours", type=float, default=1.0,
                    help="ask for --yes past this many hours of planned wall time (default: 1)")
    ap.add_argument("--plan", action="store_true", help="print the plan (replays, wall time) and stop")
    ap.add_argument("--quick", action="store_true", help="small run: 1 seed, 100 tasks (unless given)")
    ap.add_argument("--figures-only", action="store_true",
                    help=f"re-render the table from OUT_DIR/{TABLE}.csv without simulating")
    ap.add_argument("--load", type=float, default=1.2,
                    help="arrival rate as a multiple of each trace's nominal rate (default: 1.2)")
    ap.add_argument("--seeds", type=int, default=None, help="arrival seeds 0..N-1 (default: 3; quick: 1)")
    ap.add_argument("--tasks", type=int, default=None, help="tasks per run (default: 500; quick: 100)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="worker processes, the notebooks' sweeps' too (default: $TOPAS_JOBS, else all cores)")
    ap.add_argument("--ray-address", default=None,
                    help="run the sweeps on Ray: 'local', 'auto' or HOST:PORT (needs the ray extra)")
    ap.add_argument("--profile", default=None, help="engine profile (default: the paper's A100 + Qwen2.5-32B)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where the tables go (default: figures/; quick: figures/quick/, so a quick "
                         "run never overwrites the committed full-run tables)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--debug", action="store_true",
                    help="show the traceback of a failure instead of its one-line message (also $TOPAS_DEBUG=1)")
    ap.add_argument("--no-notebooks", action="store_true",
                    help="only the results table; do not execute the notebooks")
    args = ap.parse_args(argv)
    if args.grid == "quick":
        args.quick = True
    args.grid = args.grid or ("quick" if args.quick else "full")
    if args.grid == "gpu-afternoon" and args.engine != "sglang":
        ap.error("--grid gpu-afternoon is a grid of replays on a real server: give --engine sglang")
    if args.server and args.servers:
        ap.error("give --server or --servers, not both")
    if args.seeds is None:
        args.seeds = 1 if args.quick else 3
    if args.grid == "gpu-afternoon":
        pass  # --tasks (if given) caps every workload of the grid
    elif args.tasks is None:
        args.tasks = 100 if args.quick else 500
    if args.out_dir is None:
        args.out_dir = REPO / "figures" / "quick" if args.quick else REPO / "figures"
        if args.engine != "sim":  # measured results never overwrite the simulated figures
            args.out_dir = args.out_dir / args.engine
        if args.grid == "gpu-afternoon":
            args.out_dir = REPO / "figures" / args.engine / "gpu-afternoon"
    for name in ("seeds", "tasks"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if not (args.load > 0 and math.isfinite(args.load)):
        ap.error("--load must be a finite number > 0")
    if args.jobs is not None and args.jobs < 1:
        ap.error("--jobs must be >= 1")
    return args


def figures_only(out_dir: Path, table: str = TABLE) -> int:
    path = out_dir / f"{table}.csv"
    if not path.is_file():
        print(f"error: {path} not found; run scripts/reproduce.py (make reproduce) first to simulate",
              file=sys.stderr)
        return 1
    rows = read_csv(path)
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        print(f"error: {path} lacks the column(s) {', '.join(missing)}; re-run scripts/reproduce.py",
              file=sys.stderr)
        return 1
    # derived columns are recomputed from the numbers (the paper's from data/paper/reported.csv)
    rows = add_comparisons(rows, paper_reported())
    print(f"re-rendering {path} (no simulation)")
    emit(rows, out_dir, table)
    return 0


class NoServer(ValueError):
    """--engine sglang without a server (a usage error: exit status 2)."""


def connect(args: argparse.Namespace):
    """The handshake with the SGLang server(s) of ``--engine sglang``: their common identity
    (:class:`topas.sglang.server.ServerIdentity`); sets ``$TOPAS_SGLANG_URL`` for this process and
    the notebooks' kernels. Raises ``topas.sglang.server.ServerError`` (one line)."""
    from topas.sglang.urls import SGLANG_URL_ENV
    from topas.sglang.server import parse_servers, preflight

    text = args.servers or args.server or os.environ.get(SGLANG_URL_ENV, "")
    if not text.strip():
        raise NoServer(f"--engine sglang replays on running SGLang servers: start one per GPU with "
                          f"`topas serve` (README, 'Running on a GPU box') and pass SERVER=URL or "
                          f"SERVERS=URL1,URL2 (--server / --servers) or set {SGLANG_URL_ENV}")
    urls = parse_servers(text)
    os.environ[SGLANG_URL_ENV] = ",".join(urls)
    ident = preflight(urls)  # the checks `topas replay` makes too
    print(f"SGLang: {len(urls)} server(s) running the topas plugin: {ident.short} "
          f"({', '.join(urls)})", flush=True)
    return ident


def table_experiments(args: argparse.Namespace, policies: list[str], profile: str) -> list:
    from studies.grid import results_table

    return results_table(args.quick, args.engine, args.load, args.seeds, args.tasks, profile, policies)


#: Set by ``make reproduce`` to the command as the user typed it (the resume hint repeats it).
INVOKED_AS_ENV = "TOPAS_INVOKED_AS"


def resume_command(argv: list[str] | None = None) -> str:
    """The command that runs this reproduction again, as the user can type it: ``make reproduce
    ...`` when make started it (``$TOPAS_INVOKED_AS``), else this Python and the script with the
    same arguments (``.venv/bin/python scripts/reproduce.py --engine sglang ...``)."""
    made = os.environ.get(INVOKED_AS_ENV, "").strip()
    if made:
        return made
    args = sys.argv[1:] if argv is None else list(argv)
    py = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
    return shlex.join([py, "scripts/reproduce.py", *args])


def refuse_past_max_hours(args: argparse.Namespace, wall: float) -> int:
    """0 to go on; else print why the plan is refused and return 2 (``--plan``: -1, stop with 0)."""
    from topas.experiments.plan import format_hours

    if args.plan:
        return -1
    if wall <= args.max_hours * 3600 or args.yes:
        return 0
    shrink = ["ARGS='--tasks N'", "more servers (SERVERS=URL1,URL2,...)"]
    if args.grid != "gpu-afternoon":
        shrink.insert(0, "GRID=gpu-afternoon")
    print(f"error: this plan takes about {format_hours(wall)}, more than --max-hours {args.max_hours:g}; "
          f"run it with --yes (make reproduce ... YES=1), or shrink it: {', '.join(shrink)}", file=sys.stderr)
    return 2


def measured_plan(args: argparse.Namespace, ident, stages_exps: list[tuple[str, list]],
                  servers: int) -> tuple[int, list, float]:
    """Plan the replays (:mod:`topas.experiments.plan`), print it; ``(status, replays to run,
    planned wall seconds)``, status 0 to go on (see :func:`refuse_past_max_hours`)."""
    from topas.experiments.plan import Stage, estimate_replays, plan_lines
    from topas.experiments.store import ResultStore

    print("planning (reading the traces, predicting each replay's drain with the simulator) ...", flush=True)
    store = ResultStore()
    stages, todo, seen = [], [], set()
    for name, exps in stages_exps:
        exps = [e for e in exps if e.key() not in seen]
        seen.update(e.key() for e in exps)
        left = [e for e in exps if not store.has(e)]
        ests = estimate_replays(left, device=ident.device if ident else None,
                                kv_pool=ident.kv_pool_tokens if ident else None, jobs=args.jobs)
        stages.append(Stage(name, left, len(exps) - len(left), ests))
        todo += left
    lines, wall = plan_lines(stages, servers)
    print(f"plan (grid {args.grid}, replays at each trace's arrival times):", flush=True)
    print("\n".join(lines), flush=True)
    return refuse_past_max_hours(args, wall), todo, wall


def simulated_plan(args: argparse.Namespace, stages_exps: list[tuple[str, list]], policies: list[str]) -> int:
    """Print the simulator's plan (:mod:`topas.experiments.sim_plan`; calibrated on this machine
    the first time per code version); 0 to go on, -1 for ``--plan``."""
    from topas.experiments.dispatch import default_jobs
    from topas.experiments.sim_plan import calibrate, sim_plan_lines
    from topas.experiments.store import ResultStore

    store = ResultStore()
    jobs = args.jobs or default_jobs()
    print("planning (a short calibration run of each policy on each of its workloads the first time per code "
          "version) ...", flush=True)
    notebooks = args.grid != "gpu-afternoon" and not args.no_notebooks
    if notebooks:  # planned only: notebook 16 runs it with its stopping rule
        from studies.protocol_runs import study as ps

        stages_exps = [*stages_exps, ("notebook 16 (read by 02, 03, 08): the protocol's grid, at most",
                                      ps.grid_bound(ps.protocol_size(args.quick)))]
    stages, seen = [], set()
    for name, exps in stages_exps:
        exps = [e for e in exps if e.key() not in seen]
        seen.update(e.key() for e in exps)
        left = [e for e in exps if not store.has(e)]
        stages.append((name, left, len(exps) - len(left)))
    costs = calibrate(policies, pairs={(e.policy, e.workload) for _, left, _ in stages for e in left},
                      progress=not args.no_progress)
    lines, _, _ = sim_plan_lines(stages, jobs, costs)
    print(f"plan (grid {args.grid}, on the simulator):", flush=True)
    print("\n".join(lines), flush=True)
    if notebooks:
        print("  (the protocol's grid is the most its stopping rule can run: a pair stops at its first load where a "
              "seed grows, so it runs fewer; runs past capacity cost more per task than the calibration's, runs well "
              "below it less; "
              "notebooks 01 and 09-13 run their own studies, not planned here)", flush=True)
    return -1 if args.plan else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from studies.grid import ENGINE_ENV
    from topas.experiments.local import ExperimentFailed
    from topas.experiments.spec import ExperimentError
    from topas.sglang.server import ServerError
    from topas.sglang.urls import SGLANG_IDENTITY_ENV

    os.environ[ENGINE_ENV] = args.engine  # the notebooks' grids run on the same engine
    from topas.experiments.store import STORE_ONLY_ENV, USE_PACKS_ENV, ResultStore

    ident = None
    try:
        if args.engine == "sglang" and not (args.figures_only and not (args.server or args.servers)):
            ident = connect(args)
        elif args.engine == "sglang":  # figures from stored replays, no server: the store names it
            from topas.sglang.server import ServerIdentity, stored_identity

            stored = stored_identity(ResultStore())
            if stored is not None:
                os.environ[SGLANG_IDENTITY_ENV] = json.dumps(stored)
                ident = ServerIdentity(**stored)
    except NoServer as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ServerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_SERVER
    if ident is not None:  # the notebooks' figures and tables say where they were measured
        os.environ[MEASURED_ON_ENV] = ident.short
    if args.figures_only:
        # Figures from stored results only: the working store, then the results shipped in
        # data/results/<engine>/; a missing result fails naming it instead of simulating.
        os.environ[STORE_ONLY_ENV] = "1"
        table = AFTERNOON_TABLE if args.grid == "gpu-afternoon" else TABLE
        status = figures_only(args.out_dir, table)
        status = status or (0 if args.grid == "gpu-afternoon" else run_notebooks(args))
        return status or write_docs(args)
    os.environ[USE_PACKS_ENV] = "0"  # a reproduction simulates everything (resumable in the store)
    try:
        return reproduce(args, ident)
    except (ServerError, ExperimentError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_SERVER
    except ExperimentFailed as e:
        if args.engine != "sglang":
            raise
        print(f"error: {e}; the replays finished before it are kept in the results store: run the "
              f"same command again to resume ({resume_command(argv)})", file=sys.stderr)
        return 1


def write_docs(args: argparse.Namespace) -> int:
    """docs/results.md and the README's findings table, from a full-size run's figures/ only."""
    if args.out_dir.resolve() == (REPO / "figures").resolve():
        from pipeline.results_doc import write_all

        for p in write_all(REPO):
            print(f"wrote {p.relative_to(REPO)}")
    return 0


def reproduce(args: argparse.Namespace, ident) -> int:
    from topas.engine.cost import DEFAULT_PROFILE
    from topas.experiments import run_many
    from studies import grid

    if args.ray_address:
        from topas.experiments.ray_backend import RAY_ADDRESS_ENV

        os.environ[RAY_ADDRESS_ENV] = args.ray_address  # the notebooks' kernels inherit it
    if args.jobs:
        from topas.experiments.dispatch import JOBS_ENV

        os.environ[JOBS_ENV] = str(args.jobs)  # the notebooks' kernels inherit it: their sweeps' workers
    measured = args.engine == "sglang"
    noun = "replays" if measured else "simulations"
    profile = args.profile or DEFAULT_PROFILE
    policies = grid.swept_policies()
    if args.grid == "gpu-afternoon":
        table_exps = grid.gpu_afternoon(tasks=args.tasks, engine=args.engine)
        policies = [p for p in grid.AFTERNOON.policies if p in policies]
    else:
        table_exps = table_experiments(args, policies, profile)
    stages = [("gpu-afternoon grid" if args.grid == "gpu-afternoon" else "results table", table_exps)]
    if args.grid != "gpu-afternoon" and not args.no_notebooks:
        stages.append(("notebooks 02-08, 14, 15 (their grids)", grid.notebook_grid(quick=args.quick, engine=args.engine)))
    pool, planned = [], None
    if measured:
        from topas.sglang.urls import SGLANG_URL_ENV

        servers = len(os.environ[SGLANG_URL_ENV].split(","))
        status, pool, planned = measured_plan(args, ident, stages, servers)
    else:
        status = simulated_plan(args, stages, policies)
    if status:
        return max(status, 0)
    t0 = time.perf_counter()
    workloads = list(dict.fromkeys(e.workload for e in table_exps))
    tasks = sorted({e.n_tasks for e in table_exps})
    print(f"{'gpu-afternoon grid' if args.grid == 'gpu-afternoon' else 'synthetic comparison'}: "
          f"{len(workloads)} workloads x {len(policies)} policies x {len({e.seed for e in table_exps})} seed(s), "
          f"{'/'.join(map(str, tasks))} tasks each, load {table_exps[0].load:g}x nominal, profile {profile}"
          + (f", measured on SGLang ({ident.short})" if ident else ""), flush=True)
    if measured:
        # every replay still to run (table and notebooks' grids) in one pool: no server waits while
        # replays remain; each is stored as it finishes, so a restart re-runs nothing finished
        n_all = sum(len(x) for _, x in stages)
        print(f"{len(pool)} {noun} to run in one pool ({n_all - len(pool)} already stored, skipped)", flush=True)
        if pool:
            t_pool = time.perf_counter()
            run_many(pool, progress=not args.no_progress, desc="replays")
            took = time.perf_counter() - t_pool
            print(f"the pool of {len(pool)} replays took {took:.1f} s on {servers} server(s); planned "
                  f"{planned:.1f} s ({took / planned:.2f}x the plan)" if planned else
                  f"the pool of {len(pool)} replays took {took:.1f} s", flush=True)
        runs = run_many(table_exps, progress=False)  # all stored now: read back
    else:
        from topas.experiments.store import ResultStore

        store = ResultStore()
        if not args.no_notebooks:
            run_timed_alone(args, store)
        left = sum(not store.has(e) for e in table_exps)
        print(f"{left} {noun} to run ({len(table_exps) - left} already stored, skipped)", flush=True)
        runs = run_many(table_exps, jobs=args.jobs, progress=not args.no_progress, desc="table",
                        ray_address=args.ray_address)
    print(f"all {noun} done in {time.perf_counter() - t0:.1f} s\n", flush=True)

    settings = {"engine": args.engine, "profile": profile, "load": table_exps[0].load,
                "tasks": args.tasks if args.grid != "gpu-afternoon" else None,
                "seeds": len({e.seed for e in table_exps}), "server": ident.short if ident else ""}
    name = AFTERNOON_TABLE if args.grid == "gpu-afternoon" else TABLE
    run_cols = list(runs[0].keys())
    from topas.provenance import environment

    inputs = {"settings": settings, "workloads": workloads, "policies": policies,
              "seeds": sorted({e.seed for e in table_exps}),
              "runs": [{"workload": r["workload"], "policy": r["policy"], "seed": r["seed"], "key": r["key"]}
                       for r in runs],
              "environment": environment()}
    write_atomic(args.out_dir / f"{name}_inputs.json", json.dumps(inputs, indent=1) + "\n")
    write_atomic(args.out_dir / f"{name}_runs.csv", csv_text(runs, run_cols))
    rows = sort_rows(add_comparisons(aggregate(runs, settings), paper_reported()), policies)
    emit(rows, args.out_dir, name)
    if args.grid == "gpu-afternoon":
        return 0
    return run_notebooks(args) or write_docs(args)


def run_timed_alone(args: argparse.Namespace, store) -> None:
    """Notebook 05's TOPAS runs (:func:`studies.grid.overhead_runs`), whose decision wall times are
    a result, simulated first and one at a time, so that no other simulation shares the machine
    while they are timed (inside notebook 02's grid they would run ``--jobs`` at a time). Stored
    ones are not re-run."""
    from studies import grid
    from topas.experiments import run_many

    todo = [e for e in grid.overhead_runs(quick=args.quick) if not store.has(e)]
    if not todo:
        return
    print(f"{len(todo)} decision-overhead run(s) first, one at a time (notebook 05 reports their decision "
          "wall times)", flush=True)
    t = time.perf_counter()
    run_many(todo, jobs=1, progress=not args.no_progress, desc="overhead", store=store)
    print(f"decision-overhead runs done in {time.perf_counter() - t:.1f} s", flush=True)


def run_notebooks(args: argparse.Namespace) -> int:
    """Execute notebooks/NN_*.ipynb in order (they simulate only what the results store lacks).
    ``--figures-only`` runs ``--jobs`` of them at once (default: all cores): they only read stored
    results; a reproduction runs one at a time, since each notebook's sweeps use every core."""
    if args.no_notebooks:
        return 0
    from pipeline.notebooks import (NOTEBOOKS_DIR, NotebookFailed, UnknownParameter, busy_note,
                                             children_cpu, execute_notebooks, notebook_paths)

    executed = NOTEBOOKS_DIR / "executed" / ("quick" if args.quick else "full")
    paths = notebook_paths(NOTEBOOKS_DIR)
    if args.engine == "sglang":  # figures/sglang/ holds measured results only
        executed = executed / args.engine
        paths = [p for p in paths if p.stem not in NOT_MEASURED]
        write_atomic(args.out_dir / "NOT_MEASURED.md", not_measured_text())
    from topas.experiments.dispatch import default_jobs

    jobs = (args.jobs or default_jobs()) if args.figures_only else 1
    print(f"\nnotebooks -> figures in {args.out_dir}, executed copies in {executed}"
          + (f", {jobs} at a time" if jobs > 1 else ""), flush=True)
    t, cpu0 = time.perf_counter(), children_cpu()
    try:
        execute_notebooks({"quick": bool(args.quick), "out_dir": str(args.out_dir)},
                          paths, executed_dir=executed, progress=not args.no_progress, jobs=jobs)
    except (NotebookFailed, UnknownParameter) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t
    print(f"notebooks done in {wall:.1f} s{busy_note(wall, cpu0, children_cpu())}", flush=True)
    return 0


def not_measured_text() -> str:
    lines = ["# Notebooks with nothing measured on the SGLang server", "",
             "`make reproduce ENGINE=sglang` writes only measured results here; these notebooks have "
             "nothing measured on the server to show, so they were not executed for it (their "
             "simulated figures are in `figures/`):", ""]
    lines += [f"- `notebooks/{k}.ipynb`: {v}" for k, v in NOT_MEASURED.items()]
    return "\n".join(lines) + "\n"


def interrupted_message(argv: list[str] | None = None) -> str:
    """The one line printed on Ctrl-C: what is kept and how to resume."""
    from topas.experiments.store import ResultStore

    store = ResultStore(packs=[])
    n = len(store.keys(packs=False))
    return (f"interrupted: {n} finished run(s) are kept in {store.root}; run the same command again "
            f"({resume_command(argv)}) to resume: finished runs are read from the store, not re-run")


def cli(argv: list[str] | None = None) -> int:
    """:func:`main`, with Ctrl-C reported in one line (exit status 130) instead of a traceback, and
    any other failure (a full disk, a damaged store, a bad input) in one line naming the item, exit
    status 1 (:mod:`topas.cli_errors`; ``--debug`` shows the traceback)."""
    from topas.cli_errors import EXIT_ERROR, debug_enabled, error_line

    try:
        return main(argv)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"\n{interrupted_message(argv)}", file=sys.stderr, flush=True)
        return 130
    except Exception as e:  # noqa: BLE001 - the one error path
        if debug_enabled("--debug" in (sys.argv[1:] if argv is None else argv)):
            raise
        sys.stdout.flush()
        print(error_line(e), file=sys.stderr, flush=True)
        return EXIT_ERROR
