#!/usr/bin/env python3
"""The fidelity benchmark: the simulator against the real SGLang server, on the CPU server here
(started by this script) or on any server (``--server URL``, e.g. a GPU box).

    python scripts/fidelity_cpu.py                       # CPU benchmark -> data/results/fidelity/cpu-tiny-llama
    python scripts/fidelity_cpu.py --ci                  # the CI-sized case -> .../cpu-tiny-llama-ci
    python scripts/fidelity_cpu.py --server URL --profile NAME --traces chain-3,dag-4 --rates 0.2,0.3 --out DIR
    python scripts/fidelity_cpu.py --resimulate          # no server: the stored runs, the current simulator

Steps: start the server (unless ``--server``), profile it (``--reprofile``, or when the profile
file is missing), replay every (trace, rate, policy) ``--repeats`` times, simulate the same
traces with the profile and the server's KV budget (and, calibrated, with the profile rescaled to
the server's speed measured around each run), and write the comparison (topas.fidelity.compare).
Must run in the SGLang environment (``.venvs/sglang-cpu/bin/python`` on the CPU machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from topas.fidelity import compare as fc  # noqa: E402
from topas.fidelity.run import (fidelity_points, replay_measure, run_fidelity, server_kv_settings,  # noqa: E402
                                speed_probe, sim_engine)
from topas.fidelity.workloads import CPU_WORKLOADS, TRACES_DIR, write_traces  # noqa: E402

RESULTS = REPO / "data" / "results" / "fidelity"
CPU_PROFILE = REPO / "data" / "profiles" / "cpu_tiny-llama.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=None, help="an SGLang server with the topas plugin (default: start the CPU one)")
    ap.add_argument("--profile", default=str(CPU_PROFILE), help="the server's profile (default: %(default)s)")
    ap.add_argument("--reprofile", action="store_true", help="measure the profile first (topas profile-server)")
    ap.add_argument("--traces", default="chain-3-cpu,dag-4-cpu",
                    help="trace names or files; the CPU workloads (topas.fidelity.workloads.CPU_WORKLOADS) by name")
    ap.add_argument("--policies", default="fcfs,lpm,topas")
    ap.add_argument("--rates", default="3,6", help="arrival rates, tasks/s")
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-calibrate", action="store_true", help="no speed probe around the runs")
    ap.add_argument("--engine-model", choices=("sglang", "legacy"), default="sglang")
    ap.add_argument("--ci", action="store_true", help="the CI case: chain-3-ci, 16 tasks, rate 3, fcfs and topas, 2 repeats, CI bars")
    ap.add_argument("--decision-log", default=None,
                    help="with --server on this machine: the server's TOPAS_DECISION_LOG (fills queueing times)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--resimulate", action="store_true",
                    help="no server: rebuild the stored comparison in --out from its measured runs with the current "
                         "simulator (after an engine change; topas.fidelity.run.resimulate)")
    args = ap.parse_args(argv)
    if args.ci:
        args.traces, args.policies, args.rates, args.repeats, args.tasks = "chain-3-ci", "fcfs,topas", "3", 2, 16
    out = args.out or RESULTS / ("cpu-tiny-llama-ci" if args.ci else "cpu-tiny-llama")
    if args.resimulate:
        from topas.fidelity.run import resimulate

        comp = resimulate(out, engine_model=args.engine_model, log=print)
        print("\n".join(fc.verdict_lines(comp)))
        return 0 if comp.passed else 3
    write_traces(TRACES_DIR)
    traces = [str(TRACES_DIR / f"{t}.json.gz") if t in CPU_WORKLOADS else t for t in args.traces.split(",")]

    def run(server: str, started: bool) -> int:
        from topas.fidelity.profile_server import profile_server

        if args.reprofile or not Path(args.profile).exists():
            profile_server(server, args.profile, device="CPU (2 shared cores), torch_native attention, OMP_NUM_THREADS=1"
                           if started else "", repeats=5)
        settings = server_kv_settings(server)
        cost, _ = sim_engine(args.profile, settings=settings)
        pts = fidelity_points(traces, args.policies.split(","), rates=args.rates, seeds=args.seeds, n_tasks=args.tasks)
        comp = run_fidelity(pts, replay_measure(server, decision_log=decision_log if started else args.decision_log), args.profile, out,
                            repeats=args.repeats, settings=settings, bars=fc.CI_BARS if args.ci else fc.BENCHMARK_BARS,
                            meta={"server": server if not started else "CPU test server (scripts/fidelity_cpu.py)",
                                  "command": "python scripts/fidelity_cpu.py " + " ".join(argv or sys.argv[1:]),
                                  "traces": args.traces, "n_tasks": args.tasks},
                            probe=None if args.no_calibrate else speed_probe(server, cost),
                            engine_model=args.engine_model)
        print("\n".join(fc.verdict_lines(comp)))
        return 0 if comp.passed else 3

    decision_log = Path("/tmp") / f"topas_fidelity_decisions_{int(time.time())}.jsonl"
    if args.server:
        return run(args.server, False)
    from topas.fidelity.cpu_server import cpu_server

    pool = 32768 if args.ci else 4096  # the CI case: no eviction (see tests_sglang/test_fidelity_ci.py)
    # the plugin prices its decisions (TOPAS's) on the simulation's profile, or the two sides
    # would compare two cost models
    with cpu_server(log_path=out.parent / f".{out.name}.server.log", decision_log=decision_log,
                    max_total_tokens=pool, profile=args.profile) as url:
        return run(url, True)


if __name__ == "__main__":
    sys.exit(main())
