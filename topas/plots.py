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


def policy_color(name: str) -> str:
    """The policy's colour; an unknown name gets a stable fallback colour (same name, same colour)."""
    if name in POLICY_COLORS:
        return POLICY_COLORS[name]
    return FALLBACK_COLORS[zlib.crc32(str(name).encode()) % len(FALLBACK_COLORS)]


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


def save_figure(fig: matplotlib.figure.Figure, name: str, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` and ``<name>.pdf`` atomically; return both paths.

    Metadata dates are dropped so that re-rendering unchanged data gives the same PDF.
    """
    out = figures_dir(out_dir)
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

    def write_md(tmp: str) -> None:
        Path(tmp).write_text(to_markdown(df, floatfmt), encoding="utf-8")

    md = _atomic_write(out / f"{name}.md", write_md)
    return [csv, md]


def text_overlaps(fig: matplotlib.figure.Figure) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts of ``fig`` whose rendered boxes overlap (for tests:
    a readable figure returns ``[]``). Texts inside one legend are compared as well."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = []
    for t in fig.findobj(matplotlib.text.Text):
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
