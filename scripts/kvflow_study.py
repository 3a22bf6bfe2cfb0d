#!/usr/bin/env python
"""KVFlow as a baseline: LPM under LRU vs KVFlow eviction, without and with the host tier.

Runs, for each workload and seed, ``lpm`` with ``EngineConfig.eviction`` ``lru`` and ``kvflow``
(``kvflow`` with a host tier also prefetches), each with ``host_tier`` off and on, through the
Experiment API, and prints a Markdown table: mean JCT, the share of prompt tokens matched in the
cache, prefix tokens recomputed (prefills of an agent prefix), prefix tokens swapped in (in a
request's own iteration / prefetched in the background), and the simulator's wall time per run.

    python scripts/kvflow_study.py                              # dag-4, chain-3, dag-10-wide (200 tasks), metagpt-*
    python scripts/kvflow_study.py --workloads dag-4 --seeds 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import topas  # noqa: F401
except ImportError:  # running from a checkout without `make install`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topas.experiments.spec import Experiment, run_experiment

#: (workload, tasks): the synthetic ones cut to 200 tasks, the MetaGPT ones whole
WORKLOADS = {"dag-4": 200, "chain-3": 200, "dag-10-wide": 200, "metagpt-sop": None, "metagpt-tl": None}


def one(workload: str, n_tasks: int | None, seed: int, eviction: str, host: bool, load: float) -> dict:
    opts = (("eviction", eviction), ("host_tier", host))
    exp = Experiment(workload=workload, policy="lpm", load=load, seed=seed, n_tasks=n_tasks, engine_options=opts)
    t0 = time.perf_counter()
    r = run_experiment(exp)
    wall = time.perf_counter() - t0
    ev = r.prefix_events
    tok = lambda kind: int(ev.loc[ev["event"] == kind, "tokens"].sum()) if len(ev) else 0  # noqa: E731
    s = r.summary
    return {"jct": s["jct_mean"], "cached": s["cached_tokens"] / max(s["prompt_tokens"], 1),
            "prefix_prefill": tok("load_prefill"), "swap_in": tok("load_swap"), "prefetched": tok("prefetch_swap"),
            "recomputed": s["recomputed_tokens"], "wall": wall}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--load", type=float, default=1.0)
    a = ap.parse_args(argv)
    print("| workload | host tier | eviction | mean JCT (s) | cached % | prefix prefill tok | swap-in tok "
          "| prefetched tok | JCT vs lru | wall s/run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in a.workloads:
        for host in (False, True):
            rows = {ev: [one(w, WORKLOADS.get(w, 200), s, ev, host, a.load) for s in a.seeds] for ev in ("lru", "kvflow")}
            base = sum(r["jct"] for r in rows["lru"]) / len(a.seeds)
            for ev, rs in rows.items():
                m = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}
                print(f"| {w} | {'hicache' if host else 'none'} | {ev} | {m['jct']:.2f} | {100 * m['cached']:.1f} "
                      f"| {m['prefix_prefill']:.0f} | {m['swap_in']:.0f} | {m['prefetched']:.0f} "
                      f"| {100 * (m['jct'] / base - 1):+.1f}% | {m['wall']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
