"""Choose `topas-both`'s reading of "next use" on the synthetic workloads and tuning seeds only.

The rule was fixed before the runs (docs/topas_plus.md, "TOPAS-both"): every candidate
(``topas/policies/topas_both.py``, ``next_use`` = steps, time, order) runs with the ``policy``
eviction strategy on chain-3, dag-4 and dag-10-wide (200 tasks, load 1.0, the first three
tuning seeds), and so does the reference LPM + LRU (SGLang's defaults). A candidate's score is
the mean over workloads of (its seed-averaged mean JCT) / (LPM + LRU's); the lowest wins,
candidates within 0.5% of it tie and a tie goes to the first in :data:`CANDIDATES` (the
simplest). TOPAS+ + LRU is run too, as a reference row, never a candidate. MetaGPT workloads and
evaluation seeds are never run here.

Writes ``data/results/selection/topas_both_selection.csv`` (one row per run) and
``topas_both_ranking.csv`` (the ranking the rule reads; ``--from-runs`` rebuilds it from the runs) and prints the
ranking and the chosen candidate.

    python scripts/select_topas_both.py                 # 200 tasks, seeds 100-102
    python scripts/select_topas_both.py --tasks 30 --seeds 1   # a smoke test (no CSV written)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from topas.experiments import Experiment, run_many
from topas.experiments.protocol.seeds import TUNING_SEEDS, first
from topas.paths import data_dir
from topas.sets import IN_SAMPLE

WORKLOADS = IN_SAMPLE
#: the selection's arrival seeds (its first ``--seeds``): tuning seeds only
SEEDS = TUNING_SEEDS
LOAD = 1.0
#: candidate name -> topas-both parameters, simplest first (the tie order), every one spelled out
CANDIDATES: dict[str, dict] = {
    "steps": {"next_use": "steps", "horizon": 4},
    "time": {"next_use": "time", "horizon": 4},
    "order": {"next_use": "order", "horizon": 4},
}
#: (label, policy, eviction) of the reference runs; the first is the score's denominator
REFERENCES = (("lpm+lru", "lpm", "lru"), ("topas-plus+lru", "topas-plus", "lru"))
TIE = 0.005
OUT = data_dir() / "results" / "selection" / "topas_both_selection.csv"
#: the ranking the rule reads (``ranking``), mean JCT to 2 decimals, ratios and scores to 4
RANK_OUT = OUT.with_name("topas_both_ranking.csv")


def experiments(tasks: int, seeds: int, seed_range: range = SEEDS) -> list[tuple[str, Experiment]]:
    """(label, run) pairs: the references and every candidate, on the first ``seeds`` of ``seed_range``."""
    out: list[tuple[str, Experiment]] = []
    for wl in WORKLOADS:
        for seed in first(seed_range, seeds, "--seeds"):
            for label, pol, ev in REFERENCES:
                out.append((label, Experiment(wl, pol, load=LOAD, seed=seed, n_tasks=tasks,
                                              engine_options={"eviction": ev})))
            for name, params in CANDIDATES.items():
                out.append((name, Experiment(wl, "topas-both", params, load=LOAD, seed=seed, n_tasks=tasks,
                                             engine_options={"eviction": "policy"})))
    return out


def ranking(rows: pd.DataFrame) -> pd.DataFrame:
    """Per label: the seed-averaged mean JCT per workload, its ratio to LPM + LRU, the score."""
    by = rows.groupby(["label", "workload"], sort=False)["jct_mean"].mean().unstack("workload")[list(WORKLOADS)]
    ratio = by.div(by.loc[REFERENCES[0][0]], axis=1)
    out = by.add_prefix("jct_").join(ratio.add_prefix("ratio_"))
    out["score"] = ratio.mean(axis=1)
    return out


def choose(rank: pd.DataFrame) -> str:
    """The rule: the lowest score; within ``TIE`` of it, the first candidate in CANDIDATES."""
    scores = rank.loc[list(CANDIDATES), "score"]
    best = scores.min()
    return next(n for n in CANDIDATES if scores[n] <= best * (1 + TIE))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--from-runs", action="store_true",
                    help=f"no runs: rank the stored runs ({OUT.name}) and write the ranking again")
    args = ap.parse_args(argv)
    if args.from_runs:
        df = pd.read_csv(OUT)
    else:
        pairs = experiments(args.tasks, args.seeds)
        rows = run_many([e for _, e in pairs], jobs=args.jobs, progress=False, store=False)
        df = pd.DataFrame([{"label": lab, "workload": e.workload, "seed": e.seed, "n_tasks": args.tasks,
                            "jct_mean": r["jct_mean"], "jct_p99": r.get("jct_p99")}
                           for (lab, e), r in zip(pairs, rows)])
    rank = ranking(df)
    pd.set_option("display.width", 200)
    print(rank.round(4).to_string())
    chosen = choose(rank)
    print(f"chosen: {chosen} {CANDIDATES[chosen]}")
    if not args.from_runs and (args.tasks, args.seeds) == (200, 3):
        OUT.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(OUT) + ".tmp")
        df.to_csv(tmp, index=False)
        tmp.replace(OUT)
        print(f"wrote {OUT}")
    if args.from_runs or (args.tasks, args.seeds) == (200, 3):
        shown = rank.round({**{c: 2 for c in rank if c.startswith("jct_")},
                            **{c: 4 for c in rank if not c.startswith("jct_")}})
        tmp = Path(str(RANK_OUT) + ".tmp")
        shown.to_csv(tmp, index_label="label")
        tmp.replace(RANK_OUT)
        print(f"wrote {RANK_OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
