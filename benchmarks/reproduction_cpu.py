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

``--timeline`` shows instead how busy the reproduction kept its cores with simulations: each run
is placed from ``created - sim_wall_s`` to ``created`` (its result's stamp, written once its
tables are stored, so each interval sits a few ms late), and the span from the first start to the
last end is split by how many simulations ran at once, with the longest stretches where none ran
(between notebooks, or while a notebook's kernel analyses) and the runs on either side of each.
Two at once on two cores is the most a reproduction can get from its simulations; the rest of the
span is the runs' own set-up and storing, sweeps' tails, and notebooks' kernels.

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


def concurrency(summaries: pd.DataFrame, gaps: int = 5) -> tuple[pd.Series, pd.DataFrame]:
    """How many simulations ran at once over the span of the runs in ``summaries`` (each from
    ``created - sim_wall_s`` to ``created``): minutes by that number (an index from 0 to the
    most), and the ``gaps`` longest stretches where none ran (``start_min`` from the first run's
    start, ``seconds``, and the keys of the runs that ended before and started after)."""
    need = {"key", "created", "sim_wall_s"}
    missing = sorted(need - set(summaries.columns))
    if missing:
        raise ValueError(f"the summaries lack column(s) {', '.join(missing)}")
    if summaries.empty:
        raise ValueError("no runs to place on a timeline")
    end = pd.to_datetime(summaries["created"], utc=True, format="ISO8601", errors="coerce")
    wall = summaries["sim_wall_s"].astype(float)
    bad = summaries.loc[end.isna() | wall.isna() | (wall < 0), "key"]
    if len(bad):
        raise ValueError(f"run {bad.iloc[0]} has no creation stamp or simulation time (created, sim_wall_s)")
    e = ((end - end.min()).dt.total_seconds()).to_numpy()
    b = e - wall.to_numpy()
    b, e = b - b.min(), e - b.min()
    key = summaries["key"].to_list()
    # each start +1, each end -1; ends before starts at the same instant (a run handing over)
    events = sorted([(t, 1, i) for i, t in enumerate(b)] + [(t, -1, i) for i, t in enumerate(e)],
                    key=lambda x: (x[0], x[1]))
    seconds: dict[int, float] = {}
    stretches = []
    running, last, ended = 0, 0.0, None
    for t, step, i in events:
        seconds[running] = seconds.get(running, 0.0) + (t - last)
        if running == 0 and t > last and ended is not None:
            stretches.append((last / 60, t - last, key[ended], key[i]))
        running += step
        if step < 0:
            ended = i
        last = t
    levels = range(max(seconds) + 1)
    minutes = pd.Series([seconds.get(k, 0.0) / 60 for k in levels], index=pd.Index(levels, name="at once"))
    top = sorted(stretches, key=lambda x: -x[1])[:gaps]
    return minutes, pd.DataFrame(top, columns=["start_min", "seconds", "after", "before"])


def print_timeline(summaries: pd.DataFrame, pack: Path) -> None:
    minutes, gaps = concurrency(summaries)
    store = _pack_store(pack)
    label = {k: store.meta(k).get("label", k) for k in {*gaps["after"], *gaps["before"]}}  # (Experiment.label)
    span = float(minutes.sum())
    busy = float((minutes * minutes.index).sum())
    print(f"the simulations of {len(summaries)} runs in {pack} over their span, {span:.1f} min (each run from "
          "its stamp less its simulation time to its stamp):")
    for k, m in minutes.items():
        print(f"  {k} at once: {m:6.1f} min ({m / span:.0%})")
    print(f"simulation time {busy:.1f} min: on two cores, {busy / (2 * span):.0%} of what the span could hold")
    print("the longest stretches with no simulation running (start, seconds, the run that ended before, the "
          "run that started after):")
    for g in gaps.itertuples(index=False):
        print(f"  {g.start_min:5.1f} min  {g.seconds:5.1f} s  {label[g.after]}  ->  {label[g.before]}")


def _pack_store(pack: Path):
    """A results store that reads ``pack`` alone (no local store)."""
    from topas.experiments.result_store import ResultStore
    from topas.experiments.store_layout import MANIFEST

    if not (pack / MANIFEST).is_file():
        raise FileNotFoundError(f"{pack} is not a results pack (no {MANIFEST}); run `make pack` after `make reproduce`")
    empty = ROOT / "build" / "empty-store"  # (a root that holds nothing: the pack alone is read)
    return ResultStore(root=empty, packs=[pack])


def read_pack(pack: Path = PACK) -> pd.DataFrame:
    """The summaries of every run in ``pack`` (nothing else: no local store)."""
    return _pack_store(pack).summaries()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--by", default="policy", choices=("policy", "workload", "n_tasks_limit", "load"),
                    help="group the runs by this summary column (default: policy)")
    ap.add_argument("--pack", type=Path, default=PACK, help="a results pack (default: data/results/sim)")
    ap.add_argument("--timeline", action="store_true",
                    help="how many simulations ran at once over the reproduction, and where none did")
    args = ap.parse_args(argv)
    if args.timeline:
        print_timeline(read_pack(args.pack), args.pack)
        return 0
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
