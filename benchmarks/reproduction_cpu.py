"""Where the shipped results' simulation time went: the engine or the policies' decisions.

Every stored run records the wall time of its whole simulation (``sim_wall_s``) and the mean wall
time of its policy's decisions (``decision_wall_mean_ms``, timed around ``Policy.decide`` and
nothing else) over its ``n_decisions`` scheduling points. Their product is the time the policy
took; the rest of the run is the engine's (its iterations, events, views and admission walks, and
the policy's hooks). This sums both over the shipped pack (``data/results/sim``: the runs of the
last ``make reproduce``, each timed on the machine that made it, two runs at a time on two cores)
and prints them per policy, so that a speed-up can be aimed where the reproduction's time is:

    python benchmarks/reproduction_cpu.py
    python benchmarks/reproduction_cpu.py --by workload

Nothing is simulated; it reads the pack's summaries (a few seconds).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "data" / "results" / "sim"

#: the columns of :func:`attribute`'s table, in order
COLUMNS = ("runs", "tasks", "points", "sim_min", "decide_min", "engine_min", "share", "decide_share",
           "us_per_point", "decide_us_per_point")


def attribute(summaries: pd.DataFrame, by: str = "policy") -> pd.DataFrame:
    """Per value of ``by`` (and a final ``all`` row): the runs, their tasks and scheduling points,
    the minutes of simulation (``sim_min``), of the policy's decisions (``decide_min``: mean
    decision time x decisions) and of the engine (the difference), the group's share of all the
    simulation time, the decisions' share of the group's, and microseconds per scheduling point,
    whole run and decisions alone. Sorted by ``sim_min``, largest first. A run without decisions
    counts none (``decision_wall_mean_ms`` missing)."""
    need = {by, "key", "n_tasks", "n_decisions", "sim_wall_s", "decision_wall_mean_ms"}
    missing = sorted(need - set(summaries.columns))
    if missing:
        raise ValueError(f"the summaries lack column(s) {', '.join(missing)}")
    if summaries.empty:
        raise ValueError("no runs to attribute")
    bad = summaries.loc[summaries["sim_wall_s"].isna() | (summaries["sim_wall_s"] < 0), "key"]
    if len(bad):
        raise ValueError(f"run {bad.iloc[0]} has no simulation time (sim_wall_s)")
    df = pd.DataFrame({
        by: summaries[by].astype(str),  # (a missing value is its own group: "nan", "None")
        "tasks": summaries["n_tasks"].astype(int),
        "points": summaries["n_decisions"].astype(int),
        "sim_s": summaries["sim_wall_s"].astype(float),
        "decide_s": summaries["decision_wall_mean_ms"].fillna(0.0).astype(float) * summaries["n_decisions"] / 1e3,
    })
    g = df.groupby(by, sort=False, dropna=False).agg(runs=("sim_s", "size"), tasks=("tasks", "sum"), points=("points", "sum"),
                                      sim_s=("sim_s", "sum"), decide_s=("decide_s", "sum"))
    g.loc["all"] = g.sum()
    out = pd.DataFrame(index=g.index)
    out["runs"], out["tasks"], out["points"] = g["runs"].astype(int), g["tasks"].astype(int), g["points"].astype(int)
    out["sim_min"] = g["sim_s"] / 60
    out["decide_min"] = g["decide_s"] / 60
    out["engine_min"] = out["sim_min"] - out["decide_min"]
    out["share"] = g["sim_s"] / g.loc["all", "sim_s"]
    out["decide_share"] = g["decide_s"] / g["sim_s"]
    per_point = g["points"].where(g["points"] > 0)
    out["us_per_point"] = g["sim_s"] / per_point * 1e6
    out["decide_us_per_point"] = g["decide_s"] / per_point * 1e6
    body = out.drop(index="all").sort_values("sim_min", ascending=False, kind="stable")
    return pd.concat([body, out.loc[["all"]]]).reindex(columns=list(COLUMNS))


def read_pack(pack: Path = PACK) -> pd.DataFrame:
    """The summaries of every run in ``pack`` (nothing else: no local store)."""
    from topas.experiments.result_store import ResultStore
    from topas.experiments.store_layout import MANIFEST

    if not (pack / MANIFEST).is_file():
        raise FileNotFoundError(f"{pack} is not a results pack (no {MANIFEST}); run `make pack` after `make reproduce`")
    empty = ROOT / "build" / "empty-store"  # (a root that holds nothing: the pack alone is read)
    return ResultStore(root=empty, packs=[pack]).summaries()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--by", default="policy", choices=("policy", "workload", "n_tasks_limit", "load"),
                    help="group the runs by this summary column (default: policy)")
    ap.add_argument("--pack", type=Path, default=PACK, help="a results pack (default: data/results/sim)")
    args = ap.parse_args(argv)
    table = attribute(read_pack(args.pack), args.by)
    fmt = {"sim_min": "{:.2f}", "decide_min": "{:.2f}", "engine_min": "{:.2f}", "share": "{:.1%}",
           "decide_share": "{:.1%}", "us_per_point": "{:.0f}", "decide_us_per_point": "{:.0f}"}
    shown = table.copy()
    for c, f in fmt.items():
        shown[c] = [f.format(v) if pd.notna(v) else "-" for v in table[c]]
    print(f"the simulations of {int(table.loc['all', 'runs'])} runs in {args.pack}, by {args.by} (minutes of "
          "wall time, summed; decide = the policy's decisions, engine = the rest of each run):")
    print(shown.to_string())
    a = table.loc["all"]
    print(f"engine {a['engine_min']:.1f} min ({1 - a['decide_share']:.0%}), the policies' decisions "
          f"{a['decide_min']:.1f} min ({a['decide_share']:.0%}), of {a['sim_min']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
