"""Workload figures: a task's stage DAG drawn, and the workloads' sizes against the KV budget."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

import matplotlib
import matplotlib.pyplot as plt
import networkx as nx
import pandas as pd

from topas.plots.style import AGENT_COLORS, workload_label


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
