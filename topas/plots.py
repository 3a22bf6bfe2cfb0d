"""The shared plotting style: policy names, colours and order; saving figures and tables.

Every notebook uses these so that a policy has the same colour, name and position in every
figure of the reproduction::

    from topas import plots
    plots.use_style()
    fig, ax = plt.subplots()
    sns.barplot(df, x="policy", y="jct_mean", hue="policy",
                order=plots.policy_order(df.policy), palette=plots.policy_palette(df.policy), ax=ax)
    plots.save_figure(fig, "jct_by_policy")           # figures/jct_by_policy.png and .pdf
    plots.save_table(summary, "jct_by_policy")         # figures/jct_by_policy.csv and .md

Colours: TOPAS is a strong vermillion and its ablations are shades of it; the baselines take
distinct colours of the Okabe-Ito colour-blind-safe palette. A policy not listed here (a new
one, or a typo) is not an error: it gets a stable fallback colour and its raw name as label.

Output folder: ``out_dir`` if given, else ``$TOPAS_FIGURES`` if set, else ``<repo>/figures``.
Files are written atomically (a temporary file in the same folder, then a rename), so a killed
notebook never leaves a half-written figure or table behind.
"""

from __future__ import annotations

import math
import numbers
import os
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import matplotlib
import matplotlib.pyplot as plt
import networkx as nx
import pandas as pd

from topas.paths import REPO_ROOT

#: Every policy in the order figures and tables list them: baselines, then TOPAS and its ablations.
POLICY_ORDER: tuple[str, ...] = (
    "fcfs",
    "lpm",
    "spf",
    "parrot-fcfs",
    "autellix-las",
    "topas",
    "topas-plus",
    "topas-no-reuse",
    "topas-no-aging",
    "topas-base",
    "topas-request-only",
)

#: Display names.
POLICY_LABELS: dict[str, str] = {
    "fcfs": "FCFS",
    "lpm": "LPM",
    "spf": "SPF",
    "parrot-fcfs": "Parrot-FCFS",
    "autellix-las": "Autellix-LAS",
    "topas": "TOPAS",
    "topas-plus": "TOPAS+ (ours)",
    "topas-no-reuse": "TOPAS w/o reuse",
    "topas-no-aging": "TOPAS w/o aging",
    "topas-base": "TOPAS-base",
    "topas-request-only": "TOPAS request-only",
}

#: One fixed colour per policy. Baselines: Okabe-Ito (colour-blind safe); TOPAS: vermillion,
#: its ablations lighter and darker shades of it.
POLICY_COLORS: dict[str, str] = {
    "fcfs": "#7F7F7F",  # grey
    "lpm": "#56B4E9",  # sky blue
    "spf": "#009E73",  # bluish green
    "parrot-fcfs": "#0072B2",  # blue
    "autellix-las": "#CC79A7",  # reddish purple
    "topas": "#D55E00",  # vermillion
    "topas-plus": "#FF4A00",  # ours, not the paper's: a brighter red-orange
    "topas-no-reuse": "#EE8A4F",
    "topas-no-aging": "#F5B48A",
    "topas-base": "#A04600",
    "topas-request-only": "#6B2F00",
}

#: Colours for names not in POLICY_COLORS, chosen by a stable hash of the name (none of them is
#: a TOPAS shade, so an unknown policy is never mistaken for TOPAS).
FALLBACK_COLORS: tuple[str, ...] = ("#F0E442", "#332288", "#44AA99", "#882255", "#999933", "#117733")

#: Display names of the workloads.
WORKLOAD_LABELS: dict[str, str] = {
    "chain-3": "Chain-3",
    "dag-4": "DAG-4",
    "dag-10-wide": "DAG-10-Wide",
    "metagpt-sop": "MetaGPT-SOP",
    "metagpt-tl": "MetaGPT-TL",
}

#: Agent colours in a workflow drawing (cycled by the agent's first appearance in the task).
AGENT_COLORS: tuple[str, ...] = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#7F7F7F",
    "#332288", "#44AA99", "#882255", "#999933",
)


# --- names, colours, order ------------------------------------------------------------------


def policy_label(name: str) -> str:
    """The display name of a policy; an unknown name is shown as it is."""
    return POLICY_LABELS.get(name, str(name))


def _fallback_color(name: str) -> str:
    """A stable colour for a name without one of its own (same name, same colour, in every process)."""
    return FALLBACK_COLORS[zlib.crc32(str(name).encode()) % len(FALLBACK_COLORS)]


def policy_color(name: str) -> str:
    """The policy's colour; an unknown name gets a stable fallback colour (same name, same colour)."""
    if name in POLICY_COLORS:
        return POLICY_COLORS[name]
    return _fallback_color(name)


def policy_order(names: Iterable[str]) -> list[str]:
    """The distinct ``names`` in POLICY_ORDER; unknown names after them, alphabetically."""
    present = list(dict.fromkeys(names))
    known = [p for p in POLICY_ORDER if p in present]
    return known + sorted(p for p in present if p not in POLICY_COLORS)


def policy_palette(names: Iterable[str] | None = None) -> dict[str, str]:
    """``{policy: colour}`` for seaborn's ``palette=`` (all known policies when ``names`` is None)."""
    return {p: policy_color(p) for p in policy_order(POLICY_ORDER if names is None else names)}


def workload_label(name: str) -> str:
    """The display name of a workload; an unknown name is shown as it is."""
    return WORKLOAD_LABELS.get(name, str(name))


# --- style ----------------------------------------------------------------------------------


def use_style(font_scale: float = 1.0) -> None:
    """The seaborn theme and matplotlib settings every figure uses."""
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", font_scale=font_scale)
    base = 10 * font_scale
    matplotlib.rcParams.update(
        {
            "font.size": base,
            "axes.titlesize": base + 1,
            "axes.labelsize": base,
            "xtick.labelsize": base - 1,
            "ytick.labelsize": base - 1,
            "legend.fontsize": base - 1,
            "legend.title_fontsize": base - 1,
            "legend.frameon": True,
            "legend.framealpha": 0.9,
            "figure.dpi": 100,
            "savefig.dpi": 200,
            "savefig.bbox": "tight",
            "figure.constrained_layout.use": True,
            "pdf.fonttype": 42,  # embed TrueType: text stays selectable and editable in the PDF
            "ps.fonttype": 42,
        }
    )


# --- output ---------------------------------------------------------------------------------


def figures_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """Where figures and tables go: ``out_dir``, else ``$TOPAS_FIGURES``, else ``<repo>/figures``."""
    if out_dir is None:
        env = os.environ.get("TOPAS_FIGURES")
        out_dir = env if env else REPO_ROOT / "figures"
    return Path(out_dir)


def _atomic_write(path: Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name in the same folder (so the rename is atomic), created by ``write`` itself so
    # the file gets the usual permissions (mkstemp would make it private)
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


#: Set (by ``scripts/reproduce.py --engine sglang``) to the SGLang server's short identity: the
#: figures and tables then say they were measured there (:func:`measured_caption`).
MEASURED_ON_ENV = "TOPAS_MEASURED_ON"


def measured_caption() -> str | None:
    """``measured on SGLang (<server>)`` when ``$TOPAS_MEASURED_ON`` names a server, else ``None``."""
    label = os.environ.get(MEASURED_ON_ENV, "").strip()
    return f"measured on SGLang ({label})" if label else None


def save_figure(fig: matplotlib.figure.Figure, name: str, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` and ``<name>.pdf`` atomically; return both paths.

    Metadata dates are dropped so that re-rendering unchanged data gives the same PDF. With
    ``$TOPAS_MEASURED_ON`` set the figure gets a footnote ``measured on SGLang (<server>)``.
    """
    out = figures_dir(out_dir)
    caption = measured_caption()
    if caption and not any(t.get_text() == caption for t in fig.texts):
        fig.text(0.99, 0.0, caption, ha="right", va="top", fontsize=7, color="0.35")
    paths = []
    for fmt, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "Producer": None})):
        paths.append(
            _atomic_write(
                out / f"{name}.{fmt}",
                lambda tmp, fmt=fmt, meta=meta: fig.savefig(tmp, format=fmt, metadata=meta, bbox_inches="tight"),
            )
        )
    return paths


def _fmt_cell(v: Any, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return format(float(v), floatfmt)
    return str(v).replace("|", "\\|").replace("\n", " ")


def to_markdown(df: pd.DataFrame, floatfmt: str = ",.1f") -> str:
    """A GitHub-flavoured Markdown table of ``df`` (no tabulate needed): numeric columns
    right-aligned, floats as ``floatfmt``, missing values empty, ``|`` escaped."""
    cols = [str(c) for c in df.columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in df.columns]
    lines = [
        "| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    for row in df.itertuples(index=False, name=None):
        lines.append("| " + " | ".join(_fmt_cell(v, floatfmt) for v in row) + " |")
    return "\n".join(lines) + "\n"


def save_table(
    df: pd.DataFrame, name: str, out_dir: str | os.PathLike | None = None, floatfmt: str = ",.1f"
) -> list[Path]:
    """Write ``<out_dir>/<name>.csv`` (full precision) and ``<name>.md`` atomically; return both paths."""
    out = figures_dir(out_dir)
    csv = _atomic_write(out / f"{name}.csv", lambda tmp: df.to_csv(tmp, index=False))

    caption = measured_caption()

    def write_md(tmp: str) -> None:
        head = f"{caption[0].upper()}{caption[1:]}.\n\n" if caption else ""
        Path(tmp).write_text(head + to_markdown(df, floatfmt), encoding="utf-8")

    md = _atomic_write(out / f"{name}.md", write_md)
    return [csv, md]


def text_overlaps(fig: matplotlib.figure.Figure) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts of ``fig`` whose rendered boxes overlap (for tests:
    a readable figure returns ``[]``). Texts inside one legend are compared as well."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # Tick labels of ticks outside an axis's view interval keep visible=True but are not drawn.
    undrawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            tol = 1e-9 * max(abs(lo), abs(hi), 1.0)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - tol <= tick.get_loc() <= hi + tol:
                    undrawn.update({id(tick.label1), id(tick.label2)})
    texts = []
    for t in fig.findobj(matplotlib.text.Text):
        if id(t) in undrawn:
            continue
        if t.get_visible() and t.get_text().strip() and t.figure is not None:
            bb = t.get_window_extent(renderer)
            if bb.width > 0 and bb.height > 0:
                texts.append((t.get_text(), bb))
    hits = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = texts[i][1], texts[j][1]
            # strict overlap of the interiors (touching edges is fine)
            if a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5:
                hits.append((texts[i][0], texts[j][0]))
    return hits


# --- workloads ------------------------------------------------------------------------------


def workflow_layout(task) -> dict[str, tuple[float, float]]:
    """Node positions for ``task.graph``: one column per topological generation (left to right),
    nodes of a column spread evenly and centred on 0."""
    g = task.graph
    pos: dict[str, tuple[float, float]] = {}
    order = {n: k for k, n in enumerate(task.topo_order)}
    for x, gen in enumerate(nx.topological_generations(g)):
        gen = sorted(gen, key=order.__getitem__)
        for k, n in enumerate(gen):
            pos[n] = (float(x), (len(gen) - 1) / 2.0 - k)
    return pos


def _text_color_on(fill: str) -> str:
    """Black or white, whichever reads better on ``fill`` (by relative luminance)."""
    r, g, b = matplotlib.colors.to_rgb(fill)
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if lum > 0.5 else "white"


def draw_workflow(task, ax: matplotlib.axes.Axes, agent_colors: Mapping[str, str] | None = None,
                  title: str | None = None, node_size: float | None = None) -> dict[str, str]:
    """Draw a task's DAG on ``ax``: stages left to right by topological generation, labelled
    with their stage ids and coloured by agent. Returns the ``{agent: colour}`` used."""
    g = task.graph
    pos = workflow_layout(task)
    if node_size is None:
        widest = max(Counter(x for x, _ in pos.values()).values())
        node_size = 700 if widest <= 4 else 380
    if agent_colors is None:
        agents = list(dict.fromkeys(g.nodes[n]["agent"] for n in task.topo_order))
        agent_colors = {a: AGENT_COLORS[k % len(AGENT_COLORS)] for k, a in enumerate(agents)}
    nodes = list(task.topo_order)
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=True, arrowstyle="-|>", arrowsize=12,
                           node_size=node_size, edge_color="#555555", width=1.2)
    nx.draw_networkx_nodes(g, pos, nodelist=nodes, ax=ax, node_size=node_size,
                           node_color=[agent_colors.get(g.nodes[n]["agent"], "#BBBBBB") for n in nodes],
                           edgecolors="#222222", linewidths=0.8)
    for n in nodes:
        fill = agent_colors.get(g.nodes[n]["agent"], "#BBBBBB")
        ax.text(*pos[n], n, ha="center", va="center", fontsize=9, fontweight="bold",
                color=_text_color_on(fill), zorder=5)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.set_axis_off()
    if title is not None:
        ax.set_title(title)
    return dict(agent_colors)


def workload_sizes(traces: Mapping[str, Any] | Iterable[Any], kv_budget_tokens: int) -> pd.DataFrame:
    """Per agent of each trace: prefix tokens, mean suffix input and true output tokens per
    call, calls per task, and the prefix as a share of the KV budget; then one ``all agents``
    row per trace with the sum of the prefixes (what keeping every prefix resident costs)."""
    if isinstance(traces, Mapping):
        traces = list(traces.values())
    rows = []
    for tr in traces:
        st = pd.DataFrame(
            [(s.agent, s.input_tokens, s.output_tokens) for t in tr.tasks for s in t.stages],
            columns=["agent", "input", "output"],
        )
        n_tasks = max(len(tr.tasks), 1)
        by = st.groupby("agent").agg(calls=("input", "size"), input=("input", "mean"), output=("output", "mean"))
        for name, a in tr.agents.items():
            r = by.loc[name] if name in by.index else None
            rows.append(
                {
                    "workload": workload_label(tr.name),
                    "agent": name,
                    "prefix tokens": int(a.prefix_tokens),
                    "mean input tokens": float(r["input"]) if r is not None else float("nan"),
                    "mean output tokens": float(r["output"]) if r is not None else float("nan"),
                    "calls per task": float(r["calls"]) / n_tasks if r is not None else 0.0,
                    "KV budget (tokens)": int(kv_budget_tokens),
                    "prefix / KV budget (%)": 100.0 * a.prefix_tokens / kv_budget_tokens,
                }
            )
        total = sum(int(a.prefix_tokens) for a in tr.agents.values())
        rows.append(
            {
                "workload": workload_label(tr.name),
                "agent": "all agents",
                "prefix tokens": total,
                "mean input tokens": float(st["input"].mean()) if len(st) else float("nan"),
                "mean output tokens": float(st["output"].mean()) if len(st) else float("nan"),
                "calls per task": len(st) / n_tasks,
                "KV budget (tokens)": int(kv_budget_tokens),
                "prefix / KV budget (%)": 100.0 * total / kv_budget_tokens,
            }
        )
    return pd.DataFrame(rows)


def plot_workflows(traces: Mapping[str, Any] | Iterable[Any], panel_size: tuple[float, float] = (3.8, 3.6)):
    """One panel per trace, each drawing its first task's DAG (titled with the workload, its
    stage count and its agents' prefix length); returns the figure."""
    if isinstance(traces, Mapping):
        traces = list(traces.values())
    traces = list(traces)
    n = len(traces)
    fig, axes = plt.subplots(1, n, figsize=(panel_size[0] * n, panel_size[1]), squeeze=False)
    for tr, ax in zip(traces, axes[0]):
        task = tr.tasks[0]
        prefixes = sorted({tr.agents[s.agent].prefix_tokens for s in task.stages})
        pre = f"{prefixes[0]:,}" if len(prefixes) == 1 else f"{prefixes[0]:,}-{prefixes[-1]:,}"
        draw_workflow(task, ax, title=f"{workload_label(tr.name)}\n{len(task.stages)} stages, prefix {pre} tokens each")
    fig.supxlabel("stages left to right in dependency order; colour = agent (each with its own prefix)",
                  fontsize=matplotlib.rcParams["font.size"] - 1)
    return fig


# --- notebooks 02-04: JCT and throughput against load, ablations ----------------------------

from typing import Sequence  # noqa: E402  (kept in this block: appended, not merged into the imports)

#: Axis labels (with units) of the summary columns the result figures plot.
METRIC_LABELS: dict[str, str] = {
    "jct_mean": "mean JCT (s)",
    "jct_p99": "p99 JCT (s)",
    "throughput_rps": "request throughput (requests/s)",
}

#: The x axis of every figure against load.
LOAD_LABEL = "load (x nominal arrival rate)"

#: Column label of the paper's own numbers in a table (never measured here).
PAPER_LABEL = "paper (reported)"


def needs_log_scale(values: Iterable[float], ratio: float = 10.0) -> bool:
    """Whether positive ``values`` span at least ``ratio`` (max/min): then a linear axis would
    squash the small ones (e.g. FCFS dwarfing everything else) and a log axis reads better."""
    v = [float(x) for x in values if x is not None and not math.isnan(float(x)) and float(x) > 0]
    return len(v) >= 2 and max(v) / min(v) >= ratio


def _policy_legend(fig: matplotlib.figure.Figure, policies: Sequence[str], kind: str = "line",
                   max_cols: int = 6) -> None:
    """One legend for the whole figure, below the panels, in policy order."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if kind == "line":
        handles = [Line2D([], [], color=policy_color(p), marker="o", lw=1.8, ms=4) for p in policies]
    else:
        handles = [Patch(facecolor=policy_color(p), edgecolor="#333333") for p in policies]
    ncol = min(len(policies), max_cols)
    fig.legend(handles, [policy_label(p) for p in policies], loc="outside lower center", ncol=ncol,
               title="policy")


def _tidy_y_axis(ax: matplotlib.axes.Axes, log: bool) -> None:
    """Fix the y ticks to the labelled ones inside the view (a locator also makes labels just
    outside the limits, which overlap the next panel's when measured); on a log axis label
    1-2-5 steps as plain numbers, with no minor labels."""
    from matplotlib import ticker

    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    if log and len(ticks) < 2:  # less than a 2x span: fall back to plain linear-style ticks
        ax.yaxis.set_major_locator(ticker.MaxNLocator(4))
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    ax.set_yticks(ticks)
    ax.set_ylim(lo, hi)


def plot_metric_vs_load(
    summaries: pd.DataFrame,
    metrics: Sequence[str] = ("jct_mean", "jct_p99"),
    workloads: Sequence[str] | None = None,
    log_y: bool | str = "auto",
    panel_size: tuple[float, float] = (3.4, 2.7),
):
    """One row of panels per metric, one column per workload: each policy's metric against load
    (a line through the mean over seeds, the band from the min to the max seed).

    ``summaries``: :func:`topas.experiments.run_sweep` rows (``workload``, ``policy``, ``load``,
    ``seed`` and the metric columns). ``log_y``: ``True``/``False``, or ``"auto"``: a log axis for
    a row whose per-policy means span 10x or more (see :func:`needs_log_scale`); the y label says
    so. Returns the figure.
    """
    import seaborn as sns

    df = summaries
    workloads = list(dict.fromkeys(df["workload"])) if workloads is None else list(workloads)
    policies = policy_order(df["policy"])
    pal = policy_palette(policies)
    nr, nc = len(metrics), len(workloads)
    fig, axes = plt.subplots(nr, nc, figsize=(panel_size[0] * nc, panel_size[1] * nr + 0.9),
                             squeeze=False, sharex=True, layout="constrained")
    for i, m in enumerate(metrics):
        means = df.groupby(["workload", "load", "policy"])[m].mean()
        log = needs_log_scale(means) if log_y == "auto" else bool(log_y)
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = df[df["workload"] == w]
            sns.lineplot(data=sub, x="load", y=m, hue="policy", hue_order=policies, palette=pal,
                         errorbar=("pi", 100), err_kws={"alpha": 0.12}, marker="o", markersize=4, ax=ax,
                         legend=False)  # faint bands: six policies' min-max ranges overlap
            _tidy_y_axis(ax, log)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(LOAD_LABEL if i == nr - 1 else "")
            label = METRIC_LABELS.get(m, m) + (", log scale" if log else "")
            ax.set_ylabel(label if j == 0 else "")
            ax.set_xticks(sorted(sub["load"].unique()))
    _policy_legend(fig, policies, max_cols=3 if nc == 1 else 6)  # one column of panels: a narrower legend
    return fig


def jct_table(summaries: pd.DataFrame, baselines: Sequence[str] | None = None) -> pd.DataFrame:
    """Per workload, load and policy: mean and p99 JCT (mean over seeds, with the min and max
    seed), request throughput, and, for every policy that is not a baseline, its change against
    the best baseline of that workload and load, chosen separately per metric (by mean over seeds):
    ``(policy - best) / best`` in %, negative = faster than every baseline."""
    if baselines is None:
        from topas.experiments.grid import BASELINES as baselines
    df = summaries
    g = df.groupby(["workload", "load", "policy"], sort=False)
    t = g.agg(
        seeds=("seed", "nunique"),
        jct_mean=("jct_mean", "mean"), jct_mean_min=("jct_mean", "min"), jct_mean_max=("jct_mean", "max"),
        jct_p99=("jct_p99", "mean"), jct_p99_min=("jct_p99", "min"), jct_p99_max=("jct_p99", "max"),
        throughput_rps=("throughput_rps", "mean"),
    ).reset_index()
    order = {p: k for k, p in enumerate(policy_order(t["policy"]))}
    wl = {w: k for k, w in enumerate(dict.fromkeys(df["workload"]))}
    t = t.sort_values(["workload", "load", "policy"], key=lambda s: s.map(wl) if s.name == "workload"
                      else (s.map(order) if s.name == "policy" else s)).reset_index(drop=True)
    for m, short in (("jct_mean", "mean"), ("jct_p99", "p99")):
        vs, best_name = [], []
        for _, r in t.iterrows():
            base = t[(t.workload == r.workload) & (t.load == r.load) & t.policy.isin(baselines)]
            if r.policy in baselines or base.empty:
                vs.append(float("nan")); best_name.append("")
                continue
            b = base.loc[base[m].idxmin()]
            vs.append(100.0 * (r[m] - b[m]) / b[m]); best_name.append(b.policy)
        t[f"{short} JCT vs best baseline (%)"] = vs
        t[f"best baseline ({short})"] = best_name
    return t.rename(columns={
        "jct_mean": "mean JCT (s)", "jct_mean_min": "mean JCT min (s)", "jct_mean_max": "mean JCT max (s)",
        "jct_p99": "p99 JCT (s)", "jct_p99_min": "p99 JCT min (s)", "jct_p99_max": "p99 JCT max (s)",
        "throughput_rps": "throughput (requests/s)",
    })


def plot_ablation_bars(
    summaries: pd.DataFrame,
    workload: str | None = None,
    metrics: Sequence[str] = ("jct_mean", "jct_p99"),
    log_x: bool | str = False,
    panel_size: tuple[float, float] = (4.2, 3.4),
):
    """One panel per metric: a horizontal bar per policy (TOPAS and its ablations on top, then
    the baselines, hatched, for reference, below a dashed line) at the mean over seeds, the
    whisker from the min to the max seed, the mean written next to it. ``log_x``: ``True``,
    ``False`` (the default: bar lengths stay proportional, the written values carry the small
    differences) or ``"auto"`` as ``log_y`` in :func:`plot_metric_vs_load`. Returns the figure."""
    from matplotlib import ticker

    from topas.experiments.grid import ABLATIONS

    df = summaries if workload is None else summaries[summaries["workload"] == workload]
    present = policy_order(df["policy"])
    policies = [p for p in ABLATIONS if p in present] + [p for p in present if p not in ABLATIONS]
    n_abl = sum(p in ABLATIONS for p in policies)
    fig, axes = plt.subplots(1, len(metrics), figsize=(panel_size[0] * len(metrics), panel_size[1]),
                             squeeze=False, sharey=True, layout="constrained")
    y = list(range(len(policies)))
    for j, (ax, m) in enumerate(zip(axes[0], metrics)):
        g = df.groupby("policy")[m].agg(["mean", "min", "max"]).reindex(policies)
        bars = ax.barh(y, g["mean"], color=[policy_color(p) for p in policies], edgecolor="#333333",
                       linewidth=0.6)
        for bar, p in zip(bars, policies):
            if p not in ABLATIONS:
                bar.set_hatch("///")
        ax.errorbar(g["mean"], y, xerr=[g["mean"] - g["min"], g["max"] - g["mean"]], fmt="none",
                    ecolor="#222222", elinewidth=1, capsize=3)
        if 0 < n_abl < len(policies):
            ax.axhline(n_abl - 0.5, color="#555555", ls="--", lw=0.8)
        log = needs_log_scale(g["mean"]) if log_x == "auto" else bool(log_x)
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        for k, p in enumerate(policies):  # the value, right of the whisker
            ax.text(g["max"].iloc[k], k, f"  {g['mean'].iloc[k]:,.0f}", va="center", ha="left",
                    fontsize=matplotlib.rcParams["font.size"] - 2)
        if not log:
            ax.set_xlim(0, float(g["max"].max()) * 1.18)
        else:
            lo, hi = ax.get_xlim()
            ax.set_xlim(lo, hi * 1.6)
        if not log:
            ax.xaxis.set_major_locator(ticker.MaxNLocator(5))
        lo, hi = ax.get_xlim()  # only the ticks inside the view (see _tidy_y_axis)
        ax.set_xticks([t for t in ax.get_xticks() if lo <= t <= hi])
        ax.set_xlim(lo, hi)
        ax.set_ylim(len(policies) - 0.5, -0.5)  # first policy on top
        ax.set_xlabel(METRIC_LABELS.get(m, m) + (", log scale" if log else ""))
        ax.grid(axis="y", visible=False)
    axes[0][0].set_yticks(y, [policy_label(p) for p in policies])  # shared: the other panels follow
    if workload is not None:
        at = ", ".join(f"{l:g}" for l in sorted(df["load"].unique()))
        fig.suptitle(f"{workload_label(workload)}, load {at}x nominal: TOPAS and its ablations "
                     f"(above the dashed line), baselines hatched")
    fig.supxlabel("bar: mean over seeds; whisker: min to max seed", fontsize=matplotlib.rcParams["font.size"] - 1)
    return fig


def ablation_table(
    summaries: pd.DataFrame,
    reported: pd.DataFrame | str | os.PathLike | None = None,
) -> pd.DataFrame:
    """Per workload and policy (TOPAS, its ablations, then the baselines): mean and p99 JCT (mean
    over seeds, min-max), the policy's change against full TOPAS ``(policy - topas) / topas``
    and, in the paper's direction, TOPAS's change against the policy ``(topas - policy) / policy``
    (both in %); next to the latter the paper's own ablation numbers from ``reported`` (default
    ``data/paper/reported.csv``), labelled ``paper (reported)``. The paper gives TOPAS vs
    TOPAS-base and a range over its single-component variants (read here as ``topas-no-reuse``
    = aging only and ``topas-no-aging`` = reuse only), on MetaGPT-TL at 0.0175 task/s: another
    workload and operating point than ours."""
    from topas.experiments.grid import ABLATIONS

    if reported is None:
        reported = REPO_ROOT / "data" / "paper" / "reported.csv"
    rep = reported if isinstance(reported, pd.DataFrame) else pd.read_csv(reported)
    rep = rep[rep["comparison"].astype(str).str.startswith("vs_topas_base")
              | rep["comparison"].astype(str).str.startswith("vs_single_component")]

    def paper(metric: str, policy: str) -> str:
        r = rep[rep["metric"] == {"jct_mean": "mean_jct", "jct_p99": "p99_jct"}.get(metric, metric)]
        if policy == "topas-base":
            v = r[r["comparison"] == "vs_topas_base"]["value_pct"]
            return f"{v.iloc[0]:+.1f}" if len(v) else ""
        if policy in ("topas-no-reuse", "topas-no-aging"):
            v = r[r["comparison"].str.startswith("vs_single_component")]["value_pct"]
            if len(v):
                lo, hi = sorted(v)[0], sorted(v)[-1]
                return f"{lo:+.1f} to {hi:+.1f} (range over single-component variants)"
        return ""

    where = "MetaGPT-TL, 0.0175 task/s"
    rows = []
    for w in dict.fromkeys(summaries["workload"]):
        d = summaries[summaries["workload"] == w]
        present = policy_order(d["policy"])
        policies = [p for p in ABLATIONS if p in present] + [p for p in present if p not in ABLATIONS]
        g = d.groupby("policy")[["jct_mean", "jct_p99"]].agg(["mean", "min", "max"])
        top = g.loc["topas"] if "topas" in g.index else None
        for p in policies:
            r = g.loc[p]
            row = {"workload": w, "load": float(d["load"].iloc[0]), "policy": p,
                   "kind": "TOPAS" if p == "topas" else ("ablation" if p in ABLATIONS else "baseline (reference)"),
                   "seeds": int(d[d.policy == p]["seed"].nunique())}
            for m, short in (("jct_mean", "mean"), ("jct_p99", "p99")):
                row[f"{short} JCT (s)"] = r[(m, "mean")]
                row[f"{short} JCT min-max (s)"] = f"{r[(m, 'min')]:,.1f}-{r[(m, 'max')]:,.1f}"
            for m, short in (("jct_mean", "mean"), ("jct_p99", "p99")):
                t = top[(m, "mean")] if top is not None else float("nan")
                v = r[(m, "mean")]
                row[f"{short} vs TOPAS (%)"] = 100.0 * (v - t) / t if p != "topas" else float("nan")
                row[f"TOPAS vs it, {short} (%)"] = 100.0 * (t - v) / v if p != "topas" else float("nan")
                row[f"{PAPER_LABEL}: TOPAS vs it, {short} (%), {where}"] = paper(m, p)
            rows.append(row)
    return pd.DataFrame(rows)


def trace_status(workloads: Sequence[str], available: Iterable[str], note: str = "") -> pd.DataFrame:
    """One row per workload: whether its trace is in ``data/traces/`` and, when it is not, ``note``."""
    avail = set(available)
    return pd.DataFrame([
        {"workload": w, "trace found": w in avail, "status": "ok" if w in avail else f"skipped: {note}".rstrip(": ")}
        for w in workloads
    ])


# --- notebooks 05-08 ------------------------------------------------------------------------
# notebooks 05-08: decision overhead, mechanism (KV occupancy, queueing), sensitivity heatmaps,
# paper vs ours. The tables behind them are in topas.experiments.analysis.

import numpy as np  # noqa: E402  (appended block)


def _hide_stale_ticklabels(fig) -> None:
    """Draw ``fig`` once and hide tick labels outside their axis's view limits (matplotlib keeps
    such labels as visible but undrawn Text objects, which :func:`text_overlaps` would count)."""
    fig.canvas.draw()
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lim), max(lim)
            tol = 1e-9 * max(abs(lo), abs(hi), 1.0)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                if loc is None or not (lo - tol <= loc <= hi + tol):
                    tick.label1.set_visible(False)
                    tick.label2.set_visible(False)


def _log_ms_axis(ax) -> None:
    """Plain numbers on a log axis (``0.1``, ``1``, ``10``) and no minor tick labels."""
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plot_decision_time(decisions: pd.DataFrame, title: str | None = None):
    """Three panels from a TOPAS run's decisions table: histogram of per-decision wall time (ms,
    log-spaced bins) with mean/p50/p99 marked, its ECDF, and candidate prefix sets per decision."""
    ms = decisions["wall_s"].to_numpy(dtype=float) * 1e3
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.6))
    marks = [("mean", ms.mean(), "-"), ("p50", np.percentile(ms, 50), "--"), ("p99", np.percentile(ms, 99), ":")]
    lo, hi = max(ms.min(), 1e-3), ms.max()
    bins = np.logspace(np.log10(lo), np.log10(hi * 1.01), 40)
    ax = axes[0]
    ax.hist(ms, bins=bins, color=policy_color("topas"), alpha=0.8)
    ax.set_xscale("log")
    for name, v, ls in marks:
        ax.axvline(v, color="black", ls=ls, lw=1.2, label=f"{name} {v:.2f} ms")
    _log_ms_axis(ax)
    ax.set_xlabel("wall time per decision (ms, log scale)")
    ax.set_ylabel("decisions")
    ax.legend(loc="best")  # the long right tail usually leaves the upper right free
    ax = axes[1]
    xs = np.sort(ms)
    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), color=policy_color("topas"))
    for name, v, ls in marks:
        ax.axvline(v, color="black", ls=ls, lw=1.2)
    ax.set_xscale("log")
    _log_ms_axis(ax)
    ax.set_xlabel("wall time per decision (ms, log scale)")
    ax.set_ylabel("fraction of decisions ≤ x")
    ax = axes[2]
    cand = decisions["info_candidates"].dropna().to_numpy(dtype=float)
    ax.hist(cand, bins=min(40, max(5, len(np.unique(cand)))), color=policy_color("topas-base"), alpha=0.8)
    ax.axvline(cand.mean(), color="black", lw=1.2, label=f"mean {cand.mean():.0f}")
    ax.set_xlabel("candidate prefix sets per decision")
    ax.set_ylabel("decisions")
    ax.legend(loc="upper right")
    if title:
        fig.suptitle(title)
    _hide_stale_ticklabels(fig)
    return fig


def plot_kv_occupancy(timelines: Mapping[tuple[str, str], pd.DataFrame], kv_budget_tokens: int,
                      panel_size: tuple[float, float] = (3.2, 2.4)):
    """A grid (rows: workloads, columns: policies) of stacked areas of KV tokens over time held by
    resident prefixes and by requests, as % of the KV budget; ``timelines`` maps
    ``(workload, policy)`` to a run's timeline table."""
    workloads = list(dict.fromkeys(w for w, _ in timelines))
    policies = policy_order(p for _, p in timelines)
    fig, axes = plt.subplots(len(workloads), len(policies), squeeze=False, sharey=True, sharex="row",
                             figsize=(panel_size[0] * len(policies), panel_size[1] * len(workloads)))
    for i, w in enumerate(workloads):
        for j, p in enumerate(policies):
            ax = axes[i][j]
            tl = timelines.get((w, p))
            if tl is None or tl.empty:
                ax.set_axis_off()
                continue
            t = tl["time"].to_numpy(dtype=float) / 60.0
            pre = 100.0 * tl["prefix_tokens"].to_numpy(dtype=float) / kv_budget_tokens
            req = 100.0 * tl["request_tokens"].to_numpy(dtype=float) / kv_budget_tokens
            ax.stackplot(t, pre, req, step="post", colors=["#BDBDBD", policy_color(p)], alpha=0.85,
                         labels=["prefixes", "requests"], lw=0)
            ax.axhline(100, color="black", lw=0.8, ls="--")
            ax.set_ylim(0, 110)
            ax.set_xlim(0, max(ax.get_xlim()[1], t.max() if len(t) else 1))
            share = np.nan
            if len(t) > 1:
                dt = np.diff(t)
                share = (pre[:-1] * dt).sum() / dt.sum()
            ax.set_title(f"{workload_label(w)} · {policy_label(p)}\nprefixes {share:.0f}% of KV (time avg)")
            if i == len(workloads) - 1:
                ax.set_xlabel("time (min)")
            if j == 0:
                ax.set_ylabel("KV tokens (% of budget)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, ["prefix tokens", "request tokens (colour: policy)"], loc="outside lower center", ncol=2)
    _hide_stale_ticklabels(fig)
    return fig


def plot_stage_queueing(queueing: pd.DataFrame, panel_size: tuple[float, float] = (5.5, 3.2)):
    """Bars of mean queueing time (s) per stage and policy, one panel per workload, stages in
    depth order and labelled ``stage (depth)``; ``queueing`` from
    :func:`topas.experiments.analysis.stage_queueing`."""
    import seaborn as sns

    workloads = list(dict.fromkeys(queueing["workload"]))
    fig, axes = plt.subplots(len(workloads), 1, squeeze=False,
                             figsize=(panel_size[0] * 1.6, panel_size[1] * len(workloads)))
    order = policy_order(queueing["policy"])
    for ax, w in zip(axes[:, 0], workloads):
        d = queueing[queueing.workload == w].sort_values(["depth", "stage"])
        stages = list(dict.fromkeys(d["stage"]))
        sns.barplot(d, x="stage", y="queue_s", hue="policy", order=stages, hue_order=order,
                    palette=policy_palette(order), ax=ax)
        depth = dict(zip(d["stage"], d["depth"]))
        ax.set_xticks(range(len(stages)), [f"{s}\n(depth {depth[s]})" for s in stages])
        ax.set_xlabel(f"{workload_label(w)}: stage (depth in the DAG; 0 = root)")
        positive = d.loc[d["queue_s"] > 0, "queue_s"]
        if needs_log_scale(positive):  # one policy's waits would flatten the others' bars
            ax.set_yscale("log")
            ax.set_ylabel("mean queueing time (s), log scale")
        else:
            ax.set_ylabel("mean queueing time (s)")
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
    fig.legend(handles, [policy_label(l) for l in labels], loc="outside upper center", ncol=len(order))
    _hide_stale_ticklabels(fig)
    return fig


def plot_sensitivity(table: pd.DataFrame, x: str, y: str, values: Sequence[str] = ("mean JCT (s)", "p99 JCT (s)"),
                     labels: Mapping[str, str] | None = None, title: str | None = None):
    """One annotated heatmap per column in ``values`` over parameters ``x`` (columns) and ``y``
    (rows) of a :func:`topas.experiments.analysis.sensitivity_table`; the best cell is boxed."""
    import seaborn as sns

    labels = dict(labels or {})
    fig, axes = plt.subplots(1, len(values), figsize=(4.6 * len(values), 3.8), squeeze=False)
    for ax, v in zip(axes[0], values):
        grid = table.pivot(index=y, columns=x, values=v).sort_index(ascending=False)
        sns.heatmap(grid, annot=True, fmt=".1f", cmap="viridis_r", ax=ax, cbar_kws={"label": v},
                    annot_kws={"fontsize": 8})
        r, c = divmod(int(np.nanargmin(grid.to_numpy())), grid.shape[1])
        ax.add_patch(matplotlib.patches.Rectangle((c, r), 1, 1, fill=False, edgecolor="red", lw=2))
        ax.set_xlabel(labels.get(x, x))
        ax.set_ylabel(labels.get(y, y))
        ax.set_title(f"TOPAS {v.split(' (')[0]} (best boxed)")
    if title:
        fig.suptitle(title)
    _hide_stale_ticklabels(fig)
    return fig


def plot_paper_vs_ours(table: pd.DataFrame):
    """Dot plot of the % changes vs the best baseline (or TOPAS-base), one line per
    workload/metric: the paper's reported number (hollow) beside ours (filled), a zero line,
    and rows without our number marked ``(ours: n/a)``; ``table`` from
    :func:`topas.experiments.analysis.paper_vs_ours` (the absolute overhead rows are skipped)."""
    d = table[table["comparison"] != "absolute"].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(d) + 1.4))
    ys = np.arange(len(d))[::-1]
    ax.axvline(0, color="black", lw=1)
    ax.scatter(d["paper_value"], ys, facecolors="none", edgecolors="black", s=40, label="paper (reported)", zorder=3)
    ours = "ours (measured on SGLang)" if measured_caption() else "ours (simulator)"
    ax.scatter(d["ours_value"], ys, color=policy_color("topas"), s=40, label=ours, zorder=4)
    names = {"mean_jct": "mean JCT", "p99_jct": "p99 JCT", "request_throughput": "throughput"}
    comps = {"vs_best_baseline": "vs best baseline", "vs_topas_base": "vs TOPAS-base",
             "vs_single_component_min": "vs 1-component (min)", "vs_single_component_max": "vs 1-component (max)"}
    ax.set_yticks(ys, [f"{workload_label(w)} · {names.get(m, m)} · {comps.get(c, c)}"
                       + (" (ours: n/a)" if np.isnan(ov) else "")
                       for w, m, c, ov in zip(d["workload"], d["metric"], d["comparison"], d["ours_value"])])
    ax.set_xlabel("TOPAS change (%)\n< 0: lower JCT (better); throughput: > 0 is better")
    fig.legend(loc="outside upper center", ncol=2)
    _hide_stale_ticklabels(fig)
    return fig


def plot_engine_model(table: pd.DataFrame, policy: str = "topas"):
    """Notebook 11: ``policy``'s mean and p99 JCT change against the best baseline, per workload,
    on each engine model of ``table`` (from :func:`topas.experiments.analysis.engine_model_table`):
    the figures' simulator (stock SGLang, filled) and the other readings (hollow)."""
    workloads = list(dict.fromkeys(table["workload"]))
    models = list(dict.fromkeys(table["engine model"]))
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 0.45 * len(workloads) + 1.6), sharey=True)
    ys = np.arange(len(workloads))[::-1]
    hollow = ["black", "grey", "tab:brown", "tab:olive"]
    labels = {"stock": "stock SGLang (the figures)", "legacy": "legacy engine model (before issue 12)",
              "host_tier=True": "+ host KV tier for every policy"}
    styles = {m: ({"color": policy_color(policy)} if m == "stock" else
                  {"facecolors": "none", "edgecolors": hollow[(i - 1) % len(hollow)]}) | {"label": labels.get(m, m)}
              for i, m in enumerate(models)}
    for ax, (col, title) in zip(axes, ((f"{policy} vs best: mean JCT %", "mean JCT"),
                                       (f"{policy} vs best: p99 JCT %", "p99 JCT"))):
        ax.axvline(0, color="black", lw=1)
        for model, style in styles.items():
            d = table[table["engine model"] == model].set_index("workload")
            ax.scatter([d[col].get(w, np.nan) for w in workloads], ys, s=40, zorder=3, **style)
        ax.set_xlabel(f"{policy_label(policy)} vs best baseline, {title} (%)")
    axes[0].set_yticks(ys, [workload_label(w) for w in workloads])
    handles, labels_ = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels_, loc="outside upper center", ncol=min(3, len(models)))
    _hide_stale_ticklabels(fig)
    return fig


# notebook 09: the utility-weights explorer ------------------------------------------------------


def plot_jct_ecdf(tasks: Mapping[str, pd.DataFrame], title: str | None = None):
    """Empirical CDF of task JCT (s) per policy; ``tasks`` maps a policy name to its tasks table."""
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for name in policy_order(tasks):
        jct = np.sort(tasks[name]["jct"].to_numpy(dtype=float))
        if not len(jct):
            continue
        frac = np.arange(1, len(jct) + 1) / len(jct)
        label = f"{policy_label(name)}: mean {jct.mean():.1f} s, p99 {np.percentile(jct, 99):.1f} s"
        ax.step(jct, frac, where="post", color=policy_color(name), label=label, lw=2)
    ax.set_xlabel("task JCT (s)")
    ax.set_ylabel("fraction of tasks")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right", fontsize="small")
    if title:
        ax.set_title(title)
    return fig


#: The H_age values (s) the weights explorer's slider offers: roughly x1.5 apart, from 5 s to 1000 s.
H_AGE_CHOICES = (5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 360.0, 600.0, 1000.0)


def slider_choices(default: float, choices: Iterable[float] = H_AGE_CHOICES) -> list[float]:
    """The sorted values of a selection slider: ``choices`` plus ``default``, so the slider can
    always show the parameter's own value (a log slider's grid snapped H_age=60 to 56.2)."""
    return sorted({float(c) for c in choices} | {float(default)})


ROBUST_XLABELS = {"prior noise": "prior noise sigma", "prior bias": "prior bias (x, log scale)",
                  "DAG visibility": "DAG visibility", "arrivals": "arrival CV (1 = Poisson)"}


def plot_robustness(table: pd.DataFrame, axis: str, estimator: str = "online",
                    panel_size: tuple[float, float] = (3.0, 2.5)):
    """Notebook 14: each policy's mean (top row) and p99 (bottom row) JCT along one knowledge
    ``axis`` of :func:`topas.experiments.analysis.robustness_table`, one column per workload.

    Policies whose point comes from their reference run (they do not read what the axis
    degrades) are drawn dashed. ``estimator``: the SPF/TOPAS output estimator shown; with
    ``"prior"`` the other policies are left out. Returns the figure."""
    df = table[(table["axis"] == axis) & (table["estimator"] == estimator)]
    workloads = list(dict.fromkeys(df["workload"]))
    policies = policy_order(df["policy"])
    nc = max(len(workloads), 1)
    fig, axes = plt.subplots(2, nc, figsize=(panel_size[0] * nc, panel_size[1] * 2 + 0.9),
                             squeeze=False, layout="constrained")
    categorical = axis == "DAG visibility"
    for i, (metric, label) in enumerate((("jct_mean", "mean JCT (s)"), ("jct_p99", "p99 JCT (s)"))):
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = df[df["workload"] == w]
            for p in policies:
                s = sub[sub["policy"] == p]
                if s.empty:
                    continue
                if categorical:
                    s = s.assign(_x=s["setting"].map({"full": 0, "online": 1})).sort_values("_x")
                    x = s["_x"]
                else:
                    s = s.sort_values("setting", key=lambda c: c.astype(float))
                    x = s["setting"].astype(float)
                dashed = (s["source"] == "reference").all() and len(s) > 1
                ax.plot(x, s[metric], marker="o", ms=3.5, lw=1.6, color=policy_color(p),
                        ls="--" if dashed else "-")
            if categorical:
                ax.set_xticks([0, 1], ["full", "online"])
                ax.set_xlim(-0.3, 1.3)
            elif axis == "prior bias":
                ax.set_xscale("log", base=2)
                vals = sorted(float(v) for v in sub["setting"].unique())
                ax.set_xticks(vals, [f"{v:g}" for v in vals])
                ax.minorticks_off()
            else:
                vals = sorted(float(v) for v in sub["setting"].unique())
                ax.set_xticks(vals, [f"{v:g}" for v in vals])
            _tidy_y_axis(ax, False)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(ROBUST_XLABELS[axis] if i == 1 else "")
            ax.set_ylabel(label if j == 0 else "")
    _policy_legend(fig, policies)
    return fig


def plot_estimator_convergence(table: pd.DataFrame, panel_size: tuple[float, float] = (3.6, 2.7)):
    """Notebook 14: median relative error of the online output estimator against the number of
    finished calls per agent, one panel per trace, one line per prior noise."""
    workloads = list(dict.fromkeys(table["workload"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.4),
                             squeeze=False, layout="constrained")
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        for s, g in sub.groupby("prior noise"):
            g = g.sort_values("n")
            ax.plot(g["n"] + 1, g["median rel. error"], marker="o", ms=3.5, label=f"sigma {s:g}")
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 6, 11, 51, 201], ["0", "1", "5", "10", "50", "200"])
        ax.minorticks_off()
        ax.set_title(workload_label(w))
        ax.set_xlabel("finished calls of the agent")
        ax.set_ylabel("median |error| / true mean" if j == 0 else "")
        ax.legend(title="prior noise", fontsize="small")
    return fig


# notebook 12: when does the paper's claim hold? ------------------------------------------------

FRACTION_LABEL = "load (x the best baseline's capacity)"


def plot_capacity_jct(table: pd.DataFrame, capacities: pd.DataFrame,
                      panel_size: tuple[float, float] = (3.2, 2.6)):
    """Mean and p99 JCT against the load as a fraction of the best baseline's capacity, per
    workload and policy (``table``: :func:`topas.experiments.claims.operating_table`); each policy's
    own capacity (``capacities``: :func:`topas.experiments.capacity.capacity_table`, its
    ``fraction of best baseline``) is marked by a triangle on the x axis in its colour. The grey
    band is beyond the best baseline's capacity."""
    workloads = list(dict.fromkeys(table["workload"]))
    policies = policy_order(table["policy"])
    metrics = (("mean JCT", "mean JCT (s)"), ("p99 JCT", "p99 JCT (s)"))
    fig, axes = plt.subplots(2, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] * 2 + 1.0),
                             squeeze=False, layout="constrained")
    for i, (col, label) in enumerate(metrics):
        log = needs_log_scale(table[col])
        for j, w in enumerate(workloads):
            ax = axes[i][j]
            sub = table[table["workload"] == w]
            ax.axvspan(1.0, max(1.3, float(sub["fraction"].max()) + 0.1), color="0.92", zorder=0)
            for p in policies:
                d = sub[sub["policy"] == p].sort_values("fraction")
                ax.plot(d["fraction"], d[col], marker="o", ms=3.5, lw=1.6, color=policy_color(p))
                cap = capacities[(capacities["workload"] == w) & (capacities["policy"] == p)]
                if i == 1 and len(cap) and math.isfinite(float(cap["fraction of best baseline"].iloc[0])):
                    x = float(cap["fraction of best baseline"].iloc[0])
                    if x <= ax.get_xlim()[1]:
                        ax.plot([x], [0.0], marker="^", ms=7, color=policy_color(p), clip_on=False,
                                transform=ax.get_xaxis_transform(), zorder=4)
            _tidy_y_axis(ax, log)
            if i == 0:
                ax.set_title(workload_label(w))
            ax.set_xlabel(FRACTION_LABEL if i == 1 else "")
            ax.set_ylabel(label + (", log scale" if log else "") if j == 0 else "")
    _policy_legend(fig, policies)
    return fig


def plot_headroom(table: pd.DataFrame, panel_size: tuple[float, float] = (3.2, 2.8)):
    """Per workload: the mean JCT of the best baseline, TOPAS and TOPAS+ (filled) at each operating
    point, the bounds every scheduler obeys (lines) and the best baseline's relaxations (hollow);
    ``table``: :func:`topas.experiments.headroom.headroom_table` rows with a ``fraction`` column."""
    workloads = list(dict.fromkeys(table["workload"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.9),
                             squeeze=False, layout="constrained")
    styles: dict[str, dict] = {}
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        for ref, d in sub.groupby("reference", sort=False):
            d = d.sort_values("fraction")
            kind = d["kind"].iloc[0]
            name = "best baseline" if ref.startswith("best baseline") else ref
            if kind == "bound":
                st = {"color": "black", "ls": "--" if "critical" in ref else ":", "lw": 1.4, "marker": None}
            elif kind == "relaxation":
                st = {"color": "0.45", "ls": "none", "marker": "o", "mfc": "none", "ms": 6}
            else:
                pol = "lpm" if name == "best baseline" else ref
                st = {"color": policy_color(pol), "ls": "-", "marker": "o", "ms": 4, "lw": 1.6}
                if name == "best baseline":
                    st["color"] = "#0072B2"
            if kind == "relaxation" and "KV" in ref:
                st["marker"] = "s"
            styles.setdefault(name if kind != "measured" else policy_label(name) if name != "best baseline" else name, st)
            ax.plot(d["fraction"], d["mean JCT"], **st)
        _tidy_y_axis(ax, True)
        ax.set_title(workload_label(w))
        ax.set_xlabel(FRACTION_LABEL)
        ax.set_ylabel("mean JCT (s), log scale" if j == 0 else "")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], **{k: v for k, v in st.items()}) for st in styles.values()]
    fig.legend(handles, list(styles), loc="outside lower center", ncol=min(4, len(styles)))
    return fig


def plot_reading_space(table: pd.DataFrame, metric: str = "mean", panel_size: tuple[float, float] = (3.0, 2.8)):
    """Per workload: TOPAS's change against the best baseline under every reading (grey dots),
    at each operating point; the default reading (the figures') in TOPAS's colour; a symmetric log
    axis where the changes span 30x or more. ``table``: :func:`topas.experiments.claims.reading_space_table`."""
    from matplotlib import ticker

    workloads = list(dict.fromkeys(table["workload"]))
    col = f"{metric} vs best %"
    fig, axes = plt.subplots(1, len(workloads), figsize=(panel_size[0] * len(workloads), panel_size[1] + 0.8),
                             squeeze=False, layout="constrained", sharey=False)
    for j, w in enumerate(workloads):
        ax = axes[0][j]
        sub = table[table["workload"] == w]
        fracs = sorted(sub["fraction"].unique())
        xs = {f: i for i, f in enumerate(fracs)}
        ax.axhline(0, color="black", lw=1)
        other = sub[sub["reading"] != "default"]
        jitter = (other["reading"].map(lambda r: (zlib.crc32(r.encode()) % 21 - 10) / 40.0)).to_numpy()
        ax.scatter(other["fraction"].map(xs) + jitter, other[col], s=12, color="0.55", alpha=0.8,
                   label="another reading")
        d = sub[sub["reading"] == "default"]
        ax.scatter(d["fraction"].map(xs), d[col], s=40, color=policy_color("topas"), zorder=3,
                   label="the figures' reading")
        ax.set_xticks(range(len(fracs)), [f"{f:g}x" for f in fracs])
        ax.set_xlabel(FRACTION_LABEL)
        ax.set_title(workload_label(w))
        if needs_log_scale(sub[col].abs() + 1, 30):
            ax.set_yscale("symlog", linthresh=50)
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:+,.0f}" if v else "0"))
        ax.set_ylabel(f"TOPAS vs best baseline, {metric} JCT (%)" if j == 0 else "")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2)
    return fig


# --- several engines (notebook 13) -----------------------------------------------------------

#: Router colours, in the registry's order (:func:`topas.cluster.available_routers`), cycled (no
#: yellow: too faint for a line); our ``topas`` router takes the TOPAS policy's colour.
ROUTER_COLORS: tuple[str, ...] = tuple(c for c in AGENT_COLORS if c not in ("#F0E442", POLICY_COLORS["topas"]))
#: Marker of each policy inside the engines in the cluster figures.
INNER_MARKERS = {"fcfs": "s", "lpm": "D", "topas": "o"}


def router_color(name: str) -> str:
    """A router's colour: its place in the registry (an unknown name: a stable fallback)."""
    from topas.cluster import available_routers

    if name == "topas":
        return policy_color("topas")
    names = [r for r in available_routers() if r != "topas"]
    if name in names:
        return ROUTER_COLORS[names.index(name) % len(ROUTER_COLORS)]
    return _fallback_color(name)


def router_order(names: Iterable[str]) -> list[str]:
    """The distinct router ``names`` in the registry's order; unknown names after them, alphabetically."""
    from topas.cluster import available_routers

    present = set(names)
    known = [r for r in available_routers() if r in present]
    return known + sorted(present - set(known))


def _router_legend(fig: matplotlib.figure.Figure, routers: Sequence[str], policies: Sequence[str] = ()) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=router_color(r), lw=1.8) for r in routers]
    labels = list(routers)
    handles += [Line2D([], [], color="#333333", lw=0, marker=INNER_MARKERS.get(p, "o"), ms=5) for p in policies]
    labels += [f"{p} inside" for p in policies]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), title="router (colour)"
               + (", policy inside the engines (marker)" if policies else ""))


def plot_cluster_jct(table: pd.DataFrame, workload: str, metric: str = "mean JCT",
                     panel_size: tuple[float, float] = (3.1, 2.5)):
    """``metric`` against the load per engine on ``workload``: one row of panels per policy inside
    the engines, one column per number of engines, one line per router (``table``:
    :func:`topas.experiments.cluster_study.cluster_table`). Hollow markers: unstable runs."""
    t = table[table["workload"] == workload]
    policies = [p for p in INNER_MARKERS if p in set(t["policy"])] + sorted(set(t["policy"]) - set(INNER_MARKERS))
    engines = sorted(set(t["engines"]))
    routers = router_order(t["router"])
    log = needs_log_scale(t[metric])
    fig, axes = plt.subplots(len(policies), len(engines), squeeze=False, sharex=True, sharey=True,
                             figsize=(panel_size[0] * max(len(engines), 2.2), panel_size[1] * len(policies) + 1.2),
                             layout="constrained")
    for i, p in enumerate(policies):
        for j, n in enumerate(engines):
            ax = axes[i][j]
            sub = t[(t["policy"] == p) & (t["engines"] == n)]
            for r in routers:
                d = sub[sub["router"] == r].sort_values("load / engine")
                if d.empty:
                    continue
                c = router_color(r)
                ax.plot(d["load / engine"], d[metric], color=c, lw=1.4)
                for stable, face in ((True, c), (False, "white")):
                    e = d[d["stable"] == stable]
                    ax.plot(e["load / engine"], e[metric], lw=0, marker=INNER_MARKERS.get(p, "o"), ms=4,
                            color=c, markerfacecolor=face)
            if i == 0:
                ax.set_title(f"{n} engines")
            if j == 0:
                ax.set_ylabel(f"{p} inside\n{metric} (s)" + (", log" if log else ""))
            if i == len(policies) - 1:
                ax.set_xlabel("load per engine (x nominal)")
            ax.set_xticks(sorted(set(t["load / engine"])))
    for row in axes:
        for ax in row:
            _tidy_y_axis(ax, log)
    fig.suptitle(f"{workload_label(workload)}: {metric} by router (hollow: unstable run)")
    _router_legend(fig, routers)
    return fig


def plot_cluster_balance(table: pd.DataFrame, load: float, panel_size: tuple[float, float] = (3.1, 2.7)):
    """Balance against locality at one load per engine: one panel per workload and number of
    engines (a row per workload), each (router, policy inside) as a point: x = the coefficient of
    variation of requests per engine, y = the mean number of engines holding an agent's prefix."""
    t = table[np.isclose(table["load / engine"], load)]
    workloads = list(dict.fromkeys(t["workload"]))
    engines = {w: sorted(set(t.loc[t["workload"] == w, "engines"])) for w in workloads}
    ncols = max(len(ns) for ns in engines.values())
    routers = router_order(t["router"])
    policies = [p for p in INNER_MARKERS if p in set(t["policy"])]
    fig, axes = plt.subplots(len(workloads), ncols, squeeze=False,
                             figsize=(panel_size[0] * ncols, panel_size[1] * len(workloads) + 1.3),
                             layout="constrained")
    for i, w in enumerate(workloads):
        for j in range(ncols):
            ax = axes[i][j]
            if j >= len(engines[w]):
                ax.set_visible(False)
                continue
            n = engines[w][j]
            sub = t[(t["workload"] == w) & (t["engines"] == n)]
            for r in sub.to_dict("records"):
                ax.plot([r["requests/engine CV"]], [r["prefix copies (mean)"]], lw=0,
                        marker=INNER_MARKERS.get(r["policy"], "o"), ms=5, color=router_color(r["router"]), alpha=0.85)
            ax.set_ylim(0.0, n + 0.3)
            ax.set_title(f"{workload_label(w)}, {n} engines")
            ax.set_xlabel("requests per engine, CV")
            ax.set_ylabel("engines holding a prefix (mean)" if j == 0 else "")
    fig.suptitle(f"Balance and prefix copies at {load:g} x nominal per engine")
    _router_legend(fig, routers, policies)
    return fig


def plot_cluster_scaling(table: pd.DataFrame, panel_size: tuple[float, float] = (4.2, 3.0)):
    """Simulation wall time and requests simulated per second against the number of engines (the
    tasks growing with it), one line per (router, policy inside) (``table``:
    :func:`topas.experiments.cluster_study.scaling_table`)."""
    from matplotlib import ticker

    fig, axes = plt.subplots(1, 2, figsize=(panel_size[0] * 2, panel_size[1] + 0.8), layout="constrained")
    for (r, p), d in table.groupby(["router", "policy"], sort=True):
        d = d.sort_values("engines")
        for ax, col in zip(axes, ("sim wall (s)", "requests / s simulated")):
            ax.plot(d["engines"], d[col], marker=INNER_MARKERS.get(p, "o"), ms=4, lw=1.5, color=router_color(r),
                    label=f"{r} + {p}")
    for ax, col in zip(axes, ("simulation wall time (s)", "requests simulated per second")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(table["engines"])))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("engines (tasks grow with them)")
        ax.set_ylabel(col)
        _tidy_y_axis(ax, needs_log_scale(table["sim wall (s)" if ax is axes[0] else "requests / s simulated"]))
    axes[0].legend(title="router + policy inside")
    return fig
