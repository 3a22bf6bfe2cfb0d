"""The utility-weights explorer (notebook 09): the JCT distribution per policy against the starting
setting, the utility terms per decision, and the sliders' choices (:data:`TOPAS_SLIDERS`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from topas.plots.style import policy_color, policy_label, policy_marker, policy_order


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
        ax.step(jct, frac, where="post", color=policy_color(name), label=label, lw=2,
                marker=policy_marker(name), ms=5, markevery=max(len(jct) // 8, 1))
    ax.set_xlabel("task JCT (s)")
    ax.set_ylabel("fraction of tasks")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right", fontsize="small")
    if title:
        ax.set_title(title)
    return fig


#: The H_age values (s) the weights explorer's slider offers: roughly x1.5 apart, from 5 s to 1000 s.
H_AGE_CHOICES = (5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 360.0, 600.0, 1000.0)


def slider_choices(default, choices: Iterable = H_AGE_CHOICES) -> list:
    """The values of a selection slider: ``choices`` plus ``default``, so the slider can always
    show the parameter's own value (a log slider's grid snapped H_age=60 to 56.2); numbers sorted,
    a switch's values (booleans, names) in the order given."""
    choices = list(choices)
    if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in [*choices, default]):
        return sorted({float(c) for c in choices} | {float(default)})
    return choices if default in choices else [default, *choices]


def fmt_value(v) -> str:
    """A slider's value as printed: numbers in ``g`` format, a switch's value as it is."""
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


@dataclass(frozen=True)
class Slider:
    """A weight's slider: the values it offers (the parameter's own value is added) and its label."""

    choices: tuple[float, ...]
    label: str


#: TOPAS's weights the explorer exposes, by :class:`~topas.policies.topas_params.TopasParams`
#: field: the utility's weights the paper names. Exposing another field is one more line here.
TOPAS_SLIDERS: dict[str, Slider] = {
    "beta": Slider(tuple(0.25 * i for i in range(17)), "beta (weight of V_reuse)"),
    "rho": Slider(tuple(0.25 * i for i in range(17)), "rho (aging strength)"),
    "H_age": Slider(H_AGE_CHOICES, "H_age (aging horizon, s)"),
    "M": Slider((0, 2, 4, 6, 8, 10), "M (every subset up to M agents)"),
    "K": Slider((1, 2, 4, 8, 16, 32, 64, 128), "K (admissions per decision)"),
    # the plan = execution switches (docs/method.md "The plan and the engine"): each other value
    # is the earlier plan
    "in_batch_guard": Slider((True, False), "in-batch guard (one request per uncached prefix)"),
    "demand": Slider(("engine", "estimate"), "d_r: the engine's reservation / an estimate"),
    "reuse_cost": Slider(("engine", "swap"), "V_reuse priced as the engine reloads / at swap speed"),
}


def jct_xlim(runs: Iterable[np.ndarray]) -> tuple[float, float]:
    """Fixed x limits for a workload's ECDFs: 0 to 10% past the longest JCT of ``runs``."""
    top = max((float(np.max(j)) for j in runs if len(j)), default=1.0)
    return 0.0, 1.1 * top


def plot_explorer(now: Mapping[str, np.ndarray], start: Mapping[str, np.ndarray], terms: Mapping[str, float],
                  start_terms: Mapping[str, float], xlim: tuple[float, float], title: str | None = None):
    """The explorer's figure: left, the ECDF of task JCT per policy (``now``; the starting
    setting ``start`` as faded dashed curves) on fixed ``xlim``; right, the mean of each term of
    TOPAS's utility per decision, now (solid) and at the start (faded)."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.0, 3.9), gridspec_kw={"width_ratios": [2.2, 1.0]})
    for name in policy_order(now):
        color = policy_color(name)
        if name in start and len(start[name]):
            ref = np.sort(start[name])
            ax.step(ref, np.arange(1, len(ref) + 1) / len(ref), where="post", color=color, lw=1.5, ls="--",
                    alpha=0.35)
        jct = np.sort(now[name])
        if not len(jct):
            continue
        frac = np.arange(1, len(jct) + 1) / len(jct)
        label = f"{policy_label(name)}: mean {jct.mean():.1f} s, p99 {np.percentile(jct, 99):.1f} s"
        ax.step(jct, frac, where="post", color=color, label=label, lw=2,
                marker=policy_marker(name), ms=5, markevery=max(len(jct) // 8, 1))
    ax.plot([], [], color="0.5", ls="--", alpha=0.5, label="dashed, faded: the start")
    ax.set_xlim(*xlim)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("task JCT (s)")
    ax.set_ylabel("fraction of tasks")
    ax.legend(loc="lower right", fontsize="x-small")
    names = list(terms) or list(start_terms)
    y = np.arange(len(names))
    bx.barh(y + 0.2, [start_terms.get(n, 0.0) for n in names], height=0.4, color=policy_color("topas"), alpha=0.3,
            label="start")
    bx.barh(y - 0.2, [terms.get(n, 0.0) for n in names], height=0.4, color=policy_color("topas"), label="now")
    for yi, n in zip(y, names):
        bx.text(terms.get(n, 0.0), yi - 0.2, f" {terms.get(n, 0.0):.3g}", va="center", fontsize=7)
    bx.set_yticks(y, names)
    bx.invert_yaxis()
    bx.set_xlabel("TOPAS: mean per decision (s)")
    bx.margins(x=0.25)
    bx.legend(loc="lower right", fontsize="x-small")
    if title:
        fig.suptitle(title, fontsize="small")
    return fig
