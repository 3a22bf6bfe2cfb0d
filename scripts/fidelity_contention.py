#!/usr/bin/env python3
"""The contention fidelity suite: prefixes competing for a small KV pool, simulator vs the real
CPU SGLang server, request by request (topas.fidelity.contention).

    python scripts/fidelity_contention.py                      # measure every case and mode, then compare
    python scripts/fidelity_contention.py --cases burst-3x3 --modes plugin --repeats 2
    python scripts/fidelity_contention.py --compare-only       # re-compare the stored runs (no server)
    python scripts/fidelity_contention.py --compare-only --engine-model base
    python scripts/fidelity_contention.py --compare-only --arrivals scheduler --tag sim-scheduler
    python scripts/fidelity_contention.py --cases evict-freq,evict-reuse --modes evict-lru,evict-lfu,evict-priority
    python scripts/fidelity_contention.py --cases cold-burst --modes plugin-guard-off,plugin-guard-on,sglang-fcfs,sglang-lpm

Measuring starts the CPU test server once per mode (the topas plugin; stock SGLang with
--schedule-policy fcfs / lpm), on 127.0.0.1, and stops it. Must run in the SGLang environment
(.venvs/sglang-cpu/bin/python) to measure; --compare-only runs anywhere topas is installed.
Writes data/results/fidelity/contention/: <case>/<mode>/ (runs.csv, comparison, raw/ measured
tables), summary_<engine>.csv, runs_<engine>.csv, requests_<engine>.parquet.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from topas.fidelity import contention as ct  # noqa: E402

CPU_PROFILE = REPO / "data" / "profiles" / "cpu_tiny-llama.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(c.name for c in ct.comparable_cases()),
                    help="comma-separated (default: the cases today's engine is compared with, %(default)s; "
                         "the needs='radix' ones, e.g. ctx-evict, only when named)")
    ap.add_argument("--modes", default=",".join(ct.MODES),
                    help="comma-separated (default: %(default)s; the eviction modes: "
                         + ",".join(ct.EVICTION_MODES) + ", recorded on " + ",".join(ct.EVICTION_CASES)
                         + "; TOPAS with and without its in-batch guard: " + ",".join(ct.GUARD_MODES)
                         + ", recorded on " + ",".join(ct.GUARD_CASES) + ")")
    ap.add_argument("--policies", default=None,
                    help="comma-separated: measure only these of each mode's policies (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", default=str(CPU_PROFILE))
    ap.add_argument("--engine-model", default="sglang", help="the simulated side (topas.fidelity.run.ENGINE_MODELS)")
    ap.add_argument("--tag", default=None, help="name of the comparison files (summary_<tag>.csv; default: the engine model)")
    ap.add_argument("--arrivals", choices=ct.ARRIVALS, default="observed",
                    help="time the per-request simulation by when the server's tokenizer received each task's first "
                         "request (observed), when it entered the scheduler's queue (scheduler: server_queued, "
                         "runs measured since it is recorded), or the trace's times (default: %(default)s)")
    ap.add_argument("--compare-only", action="store_true", help="no server: compare the stored runs")
    ap.add_argument("--out", type=Path, default=ct.OUT_DIR)
    args = ap.parse_args(argv)
    try:
        cases = [ct.CASES[c] for c in args.cases.split(",") if c]
        modes = [ct.find_mode(m) for m in args.modes.split(",") if m]
    except KeyError as e:
        ap.error(f"unknown case or mode {e}; cases: {', '.join(ct.CASES)}; modes: {', '.join(ct.all_modes())}")
    if args.policies:
        keep = [p for p in args.policies.split(",") if p]
        modes = [dataclasses.replace(m, policies=tuple(p for p in m.policies if p in keep)) for m in modes]
        modes = [m for m in modes if m.policies]
        if not modes:
            ap.error(f"no mode runs any of {', '.join(keep)}")
    if not args.compare_only:
        ct.measure_cases(cases, modes, args.profile, args.out, repeats=args.repeats, engine_model=args.engine_model)
    summary = ct.evaluate(cases, modes, args.out, engine_model=args.engine_model, tag=args.tag,
                          arrivals=args.arrivals)
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary[["case", "mode", "policy", "repeats", "cached_agree", "hit_agree", "same_misses_all", "misses_sim",
                       "misses_server", "wave_agree", "order_agree", "noise_hit_agree",
                       *[c for c in ("jct_mean_err", "jct_p99_err", "jct_mean_ci90") if c in summary], "ok"]]
              .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0 if summary["ok"].all() else 3


if __name__ == "__main__":
    sys.exit(main())
