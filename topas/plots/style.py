"""Policy and workload names, colours and order, and the figure style every notebook shares."""

from __future__ import annotations

import zlib
from typing import Iterable

import matplotlib


#: Every policy in the order figures and tables list them: baselines, then TOPAS and its ablations.
POLICY_ORDER: tuple[str, ...] = (
    "fcfs",
    "lpm",
    "spf",
    "parrot-fcfs",
    "autellix-las",
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
    "spf": "SPF",
    "parrot-fcfs": "Parrot-FCFS",
    "autellix-las": "Autellix-LAS",
    "topas": "TOPAS",
    "topas-plus": "TOPAS+ (ours)",
    "topas-both": "TOPAS-both (ours)",
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
    "topas-both": "#C24100",  # ours too: TOPAS+ with its eviction order, a deeper red-orange
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
