"""Assembles docs/results.md and the README's "what we find" table from the tables in figures/.

Nothing here computes a result: it copies the Markdown tables that ``make reproduce`` /
``make figures`` wrote into ``figures/``, each under a short fixed caption, so the documents
cannot drift from the shipped files. ``write_all`` is called at the end of a full-size
``scripts/reproduce.py`` run (not for ``--quick``, whose tables live in ``figures/quick/``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from topas.sets import CANDIDATES

#: (table in figures/, section title, caption). The order is the order of docs/results.md.
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("paper_vs_ours.md", "The paper's numbers next to ours",
     "Each claim the paper reports (labelled \"paper\") and our simulator's number for the same comparison."),
    ("capacity_table.md", "Capacity, by the protocol",
     "Per workload and policy: the largest grid load at which every one of the 5 evaluation seeds' runs "
     "(1,000 tasks; MetaGPT 600) passes the steady-state test there and at every lower grid load "
     "(`capacity`, `lower`), the first rejected grid load (`upper`), the seeds' own capacities "
     "(`seed_low`-`seed_high`; `seed_high` censored at the load where the grid stopped), and each policy against the workload's best baseline by capacity at grid "
     "resolution. `sample`: in-sample where TOPAS+ was selected, held-out otherwise."),
    ("verdict_table.md", "Latency, by the protocol",
     "TOPAS and TOPAS+ against the best baseline at every grid load within both policies' capacities: "
     "the paired difference in mean JCT over the 5 evaluation seeds (common random numbers) with its 95% "
     "t interval, and in p99 JCT with a 95% BCa bootstrap interval; win / loss only where the interval "
     "excludes zero. `near_capacity`: the highest load compared."),
    ("capacity_table_guarded.md", "Capacity, against the guarded baselines",
     "The capacity table's verdicts against the best of the baselines with the in-batch guard (fcfs-guarded, "
     "lpm-guarded, spf-guarded, k-lpm-guarded: each baseline's order less the requests past their agent's "
     "admit cap, the rule TOPAS's plans follow), so that no claim rests on the baselines lacking it."),
    ("verdict_table_guarded.md", "Latency, against the guarded baselines",
     "TOPAS and TOPAS+ against the best guarded baseline at every grid load within both capacities, "
     "paired as above."),
    ("plan_execution_table.md", "The plan and the engine",
     "Per workload and policy at 1.0x nominal, 3 evaluation seeds: the duplicate prefix copies the engine "
     "computed, the admissions planned and made, the preemptions and those whose room went unused; TOPAS "
     "and TOPAS+ also with their earlier plan."),
    ("plan_terms_table.md", "TOPAS's utility terms per decision",
     "The chosen plan's terms (seconds), means over the decisions with a request waiting, and the share "
     "of decisions where each is non-zero."),
    ("mechanism_case_table.md", "The mechanism case: Chain-2",
     "Two 6,144-token prefixes: JCT, completion (overload below 0.95) and the decode batch against load, "
     "3 evaluation seeds of 400 tasks."),
    ("overload_table.md", "Overload, by the protocol",
     "Per workload and policy, the first grid load past its capacity, labelled overload: seeds whose "
     "queues grow, completed share, throughput, mean JCT and the growth of the tasks in the system."),
    ("convergence_table.md", "Run length: the convergence study",
     "The steady-state verdict per policy, load and run length on DAG-4 (10k-task trace), 5 evaluation "
     "seeds."),
    ("readings_verdict_table.md", "When does the claim hold, over the readings",
     "TOPAS vs the best baseline over every reading of the paper and every load, below and beyond capacity "
     "(one seed per cell; the protocol's tables above are the evidence)."),
    ("robustness_verdict.md", "Which conclusions survive uncertainty",
     "Each conclusion checked against seeds, cost-model noise and estimator error."),
    ("capacity_search_table.md", "Capacity by bisection (one seed)",
     "The load each policy sustains before queues grow without bound, from one seed's 600-task bisection."),
    ("operating_points_table.md", "Operating points", "The loads the tables below are run at."),
    ("synthetic_jct_table.md", "Synthetic workloads: JCT", "Mean and p99 job completion time per policy and load."),
    ("results_synthetic.md", "Synthetic workloads: every run", "The full results table the notebooks read."),
    ("metagpt_jct_table.md", "MetaGPT workloads: JCT", "Mean and p99 job completion time per policy and load."),
    ("metagpt_status.md", "MetaGPT workloads: status", "Which MetaGPT runs finished."),
    ("metagpt_cache_runs.md", "MetaGPT workloads: what the cache holds",
     "Each MetaGPT workload at nominal load, 5 evaluation seeds, with agent prefixes as the only shared KV "
     "and with the radix tree of the trace's token segments: share of prompt tokens served from the cache, "
     "JCT, and the protocol's steady-state test."),
    ("metagpt_cache_verdict.md", "MetaGPT workloads: the verdict under each cache model",
     "TOPAS and TOPAS+ vs LPM: paired difference in mean JCT over the 5 seeds, 95% t interval; "
     "win / tie / loss only where the interval excludes zero; not compared where a policy is unstable."),
    ("eviction_verdict.md", "Eviction: does any combination beat the best baseline (full length)",
     "Per workload and host tier at nominal load, on the eviction study's full-length stage (the cells the verdict "
     "compares, picked on the screen and re-run at the protocol's run length): the declared candidate (TOPAS-both "
     "with its own eviction order) and the best TOPAS / TOPAS+ / TOPAS-both cell against the best baseline cell "
     "(FCFS, LPM or SPF with its screen-best eviction order or LRU, LPM+KVFlow included), paired difference in mean "
     "JCT over the evaluation seeds, 95% t interval; win / loss only where it excludes zero; not compared where a "
     "compared cell is not stable. Belady, an offline bound, is never a candidate."),
    ("eviction_full_cells.md", "Eviction: the cells of the full-length stage",
     "Which cells the screen picked for the full-length runs, and why each is there."),
    ("eviction_screen_verdict.md", "Eviction (screen, 100 tasks): the verdict on the screen's runs",
     "The screen's verdict, on runs a tenth of the protocol's length, where the steady-state test is not reliable; "
     "the study's verdict is the full-length one. Per workload and host tier at nominal load: the best TOPAS / "
     "TOPAS+ cell (admission + eviction order) against the best baseline cell (FCFS, LPM or SPF with any eviction "
     "order, LPM+KVFlow included), paired difference in mean JCT over the evaluation seeds, 95% t interval; win / "
     "loss only where it excludes zero. Belady, an offline bound, is never a candidate."),
    ("eviction_matters.md", "Eviction (screen, 100 tasks): where does it matter",
     "Per admission policy and host tier: the best eviction order against LRU (paired relative difference in mean "
     "JCT, 95% interval) and the spread of the orders' mean JCT."),
    ("eviction_gap.md", "Eviction (screen, 100 tasks): the Belady gap",
     "Each eviction order against Belady (an offline bound that reads the true future; not a policy) under the "
     "same admission policy: uncached prompt tokens and mean JCT in percent of the bound's."),
    ("eviction_seeds.md", "Eviction (screen, 100 tasks): which arrival seeds read as growth",
     "Per arrival seed, in how many of the study's cells (100 tasks per run) the steady-state test finds its run "
     "growing; a seed that grows under nearly every policy says the runs are short for the test."),
    ("ablations_table.md", "Ablations", "TOPAS with one component removed at a time."),
    ("claims_ablations_table.md", "Ablation claims", "The paper's ablation claims next to ours."),
    ("topas_plus_table.md", "TOPAS+ (ours, not the paper's)", "Our extension against TOPAS and the baselines."),
    ("topas_plus_selection.md", "TOPAS+ selection", "How TOPAS+'s settings were chosen."),
    ("mechanism_table.md", "Mechanism", "Where the time goes: queueing, prefill, KV occupancy."),
    ("headroom_table.md", "Headroom", "How far each policy is from an oracle bound."),
    ("reading_space_table.md", "Readings of the paper", "Every reading of an ambiguous passage, and its result."),
    ("reading_space_spread.md", "Spread over readings", "How much the readings move the result."),
    ("sensitivity_table.md", "Sensitivity to TOPAS's weights", "JCT as the utility weights vary."),
    ("robustness_table.md", "Robustness", "Results under perturbed inputs."),
    ("robustness_estimator_table.md", "Robustness to the length estimator", "Results as the estimator's error grows."),
    ("robustness_stability.md", "Stability over seeds", "How much results move between seeds."),
    ("overhead_table.md", "Decision overhead", "Time TOPAS spends deciding, per decision and as a share of wall time."),
    ("engine_model_table.md", "Engine model", "The simulator's engine model, per setting."),
    ("engine_model_shift.md", "Engine model shift", "How results shift with the engine model."),
    ("cluster_best_table.md", "Several engines: best router", "The best router per workload and load."),
    ("cluster_router_table.md", "Several engines: routers", "Every router per workload and load."),
    ("cluster_runs_table.md", "Several engines: every run", "The full cluster results."),
    ("cluster_scaling_table.md", "Several engines: scaling", "JCT as engines are added."),
    ("fidelity_table.md", "Fidelity: simulator vs measured", "The simulator against measured SGLang runs."),
    ("fidelity_path.md", "Fidelity: per path", "Fidelity per request path."),
    ("fidelity_noise.md", "Fidelity: noise", "Measurement noise of the reference runs."),
    ("fidelity_contention.md", "Fidelity: contention", "Fidelity under contention."),
    ("fidelity_contention_arrivals.md", "Fidelity: contention, arrivals", "Fidelity under contention, by arrival pattern."),
    ("fidelity_contention_current.md", "Fidelity: contention, current engine", "Fidelity under contention, current engine model."),
    ("workloads_sizes.md", "Workload sizes", "Tasks, requests and tokens per workload."),
)

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
GUARDED_BEGIN, GUARDED_END = "<!-- results-guarded:begin -->", "<!-- results-guarded:end -->"
HEADER = ("# Results\n\n"
          "Generated by `pipeline/results_doc.py` from the tables in `figures/` (written by\n"
          "`make reproduce` / `make figures`); do not edit by hand. Loads are multiples of each trace's\n"
          "nominal rate unless a table says otherwise. Numbers labelled \"paper\" are the paper's\n"
          "(`data/paper/reported.csv`); all others are ours.\n")


def results_markdown(figures: Path) -> str:
    """docs/results.md's text: each table in SECTIONS that exists in ``figures``, with its caption."""
    parts = [HEADER]
    for name, title, caption in SECTIONS:
        path = figures / name
        if not path.is_file():
            continue
        parts.append(f"\n## {title}\n\n{caption} Source: `figures/{name}`.\n\n{path.read_text().strip()}\n")
    return "".join(parts)


def _load(x: str) -> str:
    return f"{float(x):g}"


def _capacity_cell(row: dict[str, str]) -> str:
    """``stable-fails``: certified on every seed at the first load and every lower one, rejected at
    the second; ``< x`` when even the lowest grid load fails; ``>= x`` at the grid's top."""
    cap, upper = float(row["capacity"]), float(row["upper"])
    if math.isnan(cap):
        return f"< {upper:g}"
    if math.isinf(upper):
        return f">= {cap:g}"
    return f"{cap:g}-{upper:g}"


def _latency_cell(rows: list[dict[str, str]]) -> str:
    """The candidate's mean JCT against the best baseline at the highest load within both
    capacities (paired, 95% interval) and the tally over every load compared."""
    if not rows:
        return "not compared (no load within both capacities)"
    top = next(r for r in rows if r["near_capacity"] == "True")
    tally = {v: sum(r["jct_verdict"] == v for r in rows) for v in ("win", "tie", "loss")}
    return (f"{float(top['jct_rel_pct']):+.1f}% [{float(top['jct_rel_low_pct']):+.1f}, "
            f"{float(top['jct_rel_high_pct']):+.1f}] vs {top['baseline']} at {_load(top['load'])}x: "
            f"**{top['jct_verdict']}**; over {len(rows)} loads {tally['win']} win / {tally['tie']} tie / "
            f"{tally['loss']} loss")


def _csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise ValueError(f"{path}: missing (notebook 16 writes it)")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _verdict_cells(workload: str, caps: list[dict], lat: list[dict]) -> list[str]:
    """A README verdict row's cells up to the paper's: the workload, its sample, the best baseline's
    capacity, then each candidate's (:data:`topas.sets.CANDIDATES`) capacity and latency verdict."""
    by = {r["policy"]: r for r in caps if r["workload"] == workload}
    any_row = next(iter(by.values()))
    base = any_row["best_baseline"]
    cells = [workload, any_row["sample"], f"{base} {_capacity_cell(by[base])}" if base in by else "none"]
    for cand in CANDIDATES:
        r = by.get(cand)
        cells.append(f"{_capacity_cell(r)} ({r['capacity_verdict']})" if r else "not run")
    for cand in CANDIDATES:
        cells.append(_latency_cell([r for r in lat if r["workload"] == workload and r["candidate"] == cand])
                     if cand in by else "not run")
    return cells


def findings_table(figures: Path) -> str:
    """The README's "what we find" table, from the protocol's tables (notebook 16):
    ``capacity_table.csv`` (capacity per policy with its grid bracket) and ``verdict_table.csv``
    (paired mean-JCT intervals where both policies are within capacity), with the paper's reported
    mean-JCT change beside them (``paper_vs_ours.csv``, labelled)."""
    caps = _csv(figures / "capacity_table.csv")
    lat = _csv(figures / "verdict_table.csv")
    paper = {r["workload"]: r["paper (reported)"] for r in _csv(figures / "paper_vs_ours.csv")
             if r["comparison"] == "vs_best_baseline" and r["metric"] == "mean_jct"}
    workloads = list(dict.fromkeys(r["workload"] for r in caps))
    if not workloads:
        raise ValueError(f"{figures / 'capacity_table.csv'}: no rows")
    lines = ["| workload | sample | capacity: best baseline | TOPAS | TOPAS+ | mean JCT, TOPAS vs best baseline "
             "| TOPAS+ vs best baseline | paper: TOPAS mean JCT vs best baseline |",
             "|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        cells = _verdict_cells(w, caps, lat)
        cells.append(f"{paper[w]} (paper)" if w in paper else "not in the paper")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def guarded_table(figures: Path) -> str:
    """The README's table of the same latency claims against the guarded baselines
    (``verdict_table_guarded.csv``, ``capacity_table_guarded.csv``, notebook 16)."""
    caps = _csv(figures / "capacity_table_guarded.csv")
    lat = _csv(figures / "verdict_table_guarded.csv")
    workloads = list(dict.fromkeys(r["workload"] for r in caps))
    lines = ["| workload | sample | capacity: best guarded baseline | TOPAS | TOPAS+ | mean JCT, TOPAS vs best "
             "guarded baseline | TOPAS+ vs best guarded baseline |", "|---|---|---|---|---|---|---|"]
    for w in workloads:
        cells = _verdict_cells(w, caps, lat)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def splice(text: str, block: str, where: str = "README.md", begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the part between ``begin`` and ``end`` replaced by ``block``."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{where}: needs exactly one {begin} ... {end} pair")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def write_all(repo: Path, figures: Path | None = None) -> list[Path]:
    """Rewrite docs/results.md and the README's marked table from ``figures`` (default repo/figures)."""
    figures = figures or repo / "figures"
    results = repo / "docs" / "results.md"
    results.write_text(results_markdown(figures))
    readme = repo / "README.md"
    text = splice(readme.read_text(), findings_table(figures))
    if GUARDED_BEGIN in text:
        text = splice(text, guarded_table(figures), begin=GUARDED_BEGIN, end=GUARDED_END)
    readme.write_text(text)
    return [results, readme]


if __name__ == "__main__":
    from topas.paths import REPO_ROOT

    for p in write_all(REPO_ROOT):
        print(f"wrote {p.relative_to(REPO_ROOT)}")
