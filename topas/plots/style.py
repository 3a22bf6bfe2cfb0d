"""Policy and workload names, colours and order, and the figure style every notebook shares."""

from __future__ import annotations

import zlib
from typing import Iterable

import matplotlib


#: Every policy in the order figures and tables list them: baselines, then TOPAS and its ablations.
POLICY_ORDER: tuple[str, ...] = (
    "fcfs",
    "lpm",
    "k-lpm",
    "spf",
    "parrot-fcfs",
    "autellix-las",
    "fcfs-guarded",
    "lpm-guarded",
    "k-lpm-guarded",
    "spf-guarded",
    "topas",
    "topas-plus",
    "topas-both",
    "topas-no-reuse",
    "topas-no-aging",
    "topas-base",
    "topas-request-only",
)

#: Display names.
POLICY_LABELS: dict[str, str] = {
    "fcfs": "FCFS",
    "lpm": "LPM",
    "k-lpm": "k-LPM",
    "spf": "SPF",
    "parrot-fcfs": "Parrot-FCFS",
    "autellix-las": "Autellix-LAS",
    "fcfs-guarded": "FCFS (guarded)",
    "lpm-guarded": "LPM (guarded)",
    "k-lpm-guarded": "k-LPM (guarded)",
    "spf-guarded": "SPF (guarded)",
    "topas": "TOPAS",
    "topas-plus": "TOPAS+ (ours)",
    "topas-both": "TOPAS-both (ours)",
    "topas-no-reuse": "TOPAS w/o reuse",
    "topas-no-aging": "TOPAS w/o aging",
    "topas-base": "TOPAS-base",
    "topas-request-only": "TOPAS request-only",
}

#: One fixed colour per policy. Baselines: Okabe-Ito (colour-blind safe); TOPAS: vermillion,
#: its ablations lighter and darker shades of it (told apart by their markers); TOPAS+ (ours):
#: black, a hue of its own; TOPAS-both (ours): purple.
POLICY_COLORS: dict[str, str] = {
    "fcfs": "#7F7F7F",  # grey
    "lpm": "#56B4E9",  # sky blue
    "k-lpm": "#66A61E",  # olive green
    "spf": "#009E73",  # bluish green
    "parrot-fcfs": "#0072B2",  # blue
    "autellix-las": "#CC79A7",  # reddish purple
    # the guarded baselines (in-batch guard): paler shades of their baseline's colour
    "fcfs-guarded": "#BFBFBF",
    "lpm-guarded": "#9ECAE1",
    "k-lpm-guarded": "#B8E186",
    "spf-guarded": "#7FCDBB",
    "topas": "#D55E00",  # vermillion
    "topas-plus": "#000000",  # ours, not the paper's: black, so it never reads as TOPAS
    "topas-both": "#6A3D9A",  # ours too (TOPAS+ with its eviction order): purple
    "topas-no-reuse": "#EE8A4F",
    "topas-no-aging": "#F5B48A",
    "topas-base": "#A04600",
    "topas-request-only": "#6B2F00",
}

#: One fixed marker per policy (distinct, so a policy is told apart without its colour too:
#: the ablations share TOPAS's hue and differ by marker).
POLICY_MARKERS: dict[str, str] = {
    "fcfs": "s",
    "lpm": "D",
    "k-lpm": "d",
    "spf": "^",
    "parrot-fcfs": "v",
    "autellix-las": "P",
    "fcfs-guarded": "x",
    "lpm-guarded": "H",
    "k-lpm-guarded": "+",
    "spf-guarded": "8",
    "topas": "o",
    "topas-plus": "*",
    "topas-both": "p",
    "topas-no-reuse": "<",
    "topas-no-aging": ">",
    "topas-base": "X",
    "topas-request-only": "h",
}

#: Markers for names not in POLICY_MARKERS / ROUTER_MARKERS (by the same stable hash as colours).
FALLBACK_MARKERS: tuple[str, ...] = ("d", "p", "8", "H", "1", "2")

#: Every router (:func:`topas.cluster.available_routers`) in the order the cluster figures list them.
ROUTER_ORDER: tuple[str, ...] = (
    "autellix-locality", "flowguard", "kairos", "least-load", "power-of-two", "prefixplace",
    "round-robin", "sglang-cache-aware", "topas", "wasma",
)

#: One fixed colour per router (Paul Tol's colour-blind-safe "muted" set; our ``topas`` router
#: takes the TOPAS policy's vermillion). Ten categories are more than colour alone separates:
#: ROUTER_MARKERS carries the rest.
ROUTER_COLORS: dict[str, str] = {
    "autellix-locality": "#882255",  # wine
    "flowguard": "#999933",  # olive
    "kairos": "#117733",  # green
    "least-load": "#88CCEE",  # cyan
    "power-of-two": "#332288",  # indigo
    "prefixplace": "#777777",  # grey
    "round-robin": "#DDAA33",  # ochre
    "sglang-cache-aware": "#44AA99",  # teal
    "topas": "#D55E00",  # vermillion, as the TOPAS policy
    "wasma": "#CC6677",  # rose
}

#: One fixed marker per router.
ROUTER_MARKERS: dict[str, str] = {
    "autellix-locality": "P",
    "flowguard": "^",
    "kairos": "v",
    "least-load": "s",
    "power-of-two": "D",
    "prefixplace": "X",
    "round-robin": "<",
    "sglang-cache-aware": ">",
    "topas": "o",
    "wasma": "h",
}

#: The canonical order of the workloads in every multi-panel figure and table.
WORKLOAD_ORDER: tuple[str, ...] = ("chain-3", "dag-4", "dag-10-wide", "metagpt-sop", "metagpt-tl")

#: A y (or x) axis of a measured quantity is logarithmic only when the values it shows span at
#: least this ratio (two orders of magnitude); below it a log axis magnifies small (seed-noise)
#: differences, so the axis stays linear and starts at zero.
LOG_SPAN = 100.0

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


def _fallback_marker(name: str) -> str:
    return FALLBACK_MARKERS[zlib.crc32(str(name).encode()) % len(FALLBACK_MARKERS)]


def policy_marker(name: str) -> str:
    """The policy's marker; an unknown name gets a stable fallback marker."""
    return POLICY_MARKERS.get(name) or _fallback_marker(name)


def policy_style(name: str) -> dict[str, str]:
    """``{"color": ..., "marker": ...}`` of a policy, for ``ax.plot(..., **policy_style(p))``."""
    return {"color": policy_color(name), "marker": policy_marker(name)}


def router_color(name: str) -> str:
    """A router's colour (an unknown name: a stable fallback colour)."""
    return ROUTER_COLORS.get(name) or _fallback_color(name)


def router_marker(name: str) -> str:
    """A router's marker (an unknown name: a stable fallback marker)."""
    return ROUTER_MARKERS.get(name) or _fallback_marker(name)


def router_order(names: Iterable[str]) -> list[str]:
    """The distinct router ``names`` in ROUTER_ORDER; unknown names after them, alphabetically."""
    present = list(dict.fromkeys(names))
    return [r for r in ROUTER_ORDER if r in present] + sorted(r for r in present if r not in ROUTER_ORDER)


def workload_order(names: Iterable[str]) -> list[str]:
    """The distinct workload ``names`` in WORKLOAD_ORDER (Chain-3, DAG-4, DAG-10-Wide,
    MetaGPT-SOP, MetaGPT-TL); unknown names after them, alphabetically."""
    present = list(dict.fromkeys(names))
    return [w for w in WORKLOAD_ORDER if w in present] + sorted(w for w in present if w not in WORKLOAD_ORDER)


def policy_order(names: Iterable[str]) -> list[str]:
    """The distinct ``names`` in POLICY_ORDER; unknown names after them, alphabetically."""
    present = list(dict.fromkeys(names))
    known = [p for p in POLICY_ORDER if p in present]
    return known + sorted(p for p in present if p not in POLICY_COLORS)


def policy_palette(names: Iterable[str] | None = None) -> dict[str, str]:
    """``{policy: colour}`` for seaborn's ``palette=`` (all known policies when ``names`` is None)."""
    return {p: policy_color(p) for p in policy_order(POLICY_ORDER if names is None else names)}


def workload_label(name: str) -> str:
    """The display name of a workload (``random-dag-1000`` is "Random DAG 1000"); an unknown name
    is shown as it is."""
    name = str(name)
    if name in WORKLOAD_LABELS:
        return WORKLOAD_LABELS[name]
    family, _, seed = name.rpartition("-")
    if family == "random-dag" and seed.isdigit():
        return f"Random DAG {seed}"
    return name


# --- style ----------------------------------------------------------------------------------


def use_style(font_scale: float = 1.0) -> None:
    """The seaborn theme and matplotlib settings every figure uses."""
    import seaborn as sns  # lazy: seaborn (and the scipy it loads) adds over a second to 'import topas.plots'

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
