"""The utility-weights explorer (notebook 09): the JCT distribution per policy and the sliders' choices."""

from __future__ import annotations

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


def slider_choices(default: float, choices: Iterable[float] = H_AGE_CHOICES) -> list[float]:
    """The sorted values of a selection slider: ``choices`` plus ``default``, so the slider can
    always show the parameter's own value (a log slider's grid snapped H_age=60 to 56.2)."""
    return sorted({float(c) for c in choices} | {float(default)})
