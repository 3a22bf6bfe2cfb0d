"""Figure captions: what a figure was made from (tasks per run, seeds, what a band or whisker
spans) written under it, so a PNG read on its own says what it shows."""

from __future__ import annotations

import math
import os
import textwrap
from typing import Iterable

import matplotlib
import matplotlib.transforms
import pandas as pd

from topas.plots.style import LOG_SPAN
from topas.provenance import MEASURED_ON_ENV


def measured_caption() -> str | None:
    """``measured on SGLang (<server>)`` when ``$TOPAS_MEASURED_ON`` names a server, else ``None``."""
    label = os.environ.get(MEASURED_ON_ENV, "").strip()
    return f"measured on SGLang ({label})" if label else None


#: What the bands of the figures against load and the whiskers of the bar charts span.
SEED_RANGE = "min to max over the seeds"


def _span(values: Iterable) -> str:
    v = sorted({int(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))})
    if not v:
        return ""
    if len(v) == 1:
        return f"{v[0]:,}"
    if v == list(range(v[0], v[-1] + 1)):
        return f"{v[0]:,}-{v[-1]:,}"
    return ", ".join(f"{x:,}" for x in v[:-1]) + f" or {v[-1]:,}"


def run_caption(df: pd.DataFrame, interval: str | None = SEED_RANGE, seed_col: str = "seed",
                tasks_col: str = "n_tasks", mark: str = "band") -> str:
    """``"500 tasks per run; seeds 0-2 (3 per point); band: min to max over the seeds"`` from
    summary rows (:func:`topas.experiments.run_sweep`: ``n_tasks`` (or ``tasks``) and ``seed``
    columns; a table of means with a ``seeds`` count says how many seeds each point averages);
    the parts whose column is missing are left out. ``interval=None`` leaves out the band's part."""
    parts = []
    if tasks_col in df.columns:
        parts.append(f"{_span(df[tasks_col])} tasks per run")
    if tasks_col not in df.columns and "tasks" in df.columns:
        parts.append(f"{_span(df['tasks'])} tasks per run")
    if seed_col in df.columns:
        seeds = df[seed_col].dropna().unique()
        parts.append(f"seed{'s' if len(seeds) > 1 else ''} {_span(seeds)} ({len(seeds)} per point)")
    elif "seeds" in df.columns:  # a table of means: the number of seeds behind each point
        n = _span(df["seeds"])
        parts.append("1 seed per point" if n == "1" else f"{n} seeds per point (their mean)")
    if interval and seed_col in df.columns and df[seed_col].nunique() > 1:
        parts.append(f"{mark}: {interval}")
    return "; ".join(parts)


def log_note(ratio: float = LOG_SPAN) -> str:
    """The caption's word on a log axis."""
    return f"log axis only where the values span {ratio:g}x or more"


def add_caption(fig: matplotlib.figure.Figure, *parts: str) -> str:
    """Give ``fig`` a caption: the non-empty ``parts`` joined by ``". "`` (with
    ``$TOPAS_MEASURED_ON`` set, the measured-on note appended, so
    :func:`topas.plots.save_figure` does not add a second one). It is written under everything
    the figure draws (legends below the panels included) by :func:`place_caption`, which
    :func:`topas.plots.save_figure` and :func:`topas.plots.text_overlaps` call: so a title added
    after the plotting function returned is still laid out. Returns the caption's text."""
    text = ". ".join(p.strip().rstrip(".") for p in parts if p and p.strip())
    measured = measured_caption()
    if measured:
        text = f"{text}. {measured[0].upper()}{measured[1:]}" if text else measured
    text = text + ("." if text and not text.endswith(".") else "")
    fig._topas_caption = text
    return text


def place_caption(fig: matplotlib.figure.Figure) -> matplotlib.text.Text | None:
    """Write the caption :func:`add_caption` gave ``fig`` (once; later calls return the same
    text), wrapped to the figure's width, left-aligned under its lowest artist. The figure is laid
    out once and that layout frozen: a figure legend is anchored to the figure's box, which a
    tight save shrinks to what is drawn (the caption included), so it would slide down onto the
    caption; pinned to the figure's coordinates it stays where the layout put it."""
    text = getattr(fig, "_topas_caption", None)
    placed = getattr(fig, "_topas_caption_artist", None)
    if placed is not None or not text:
        return placed
    width = max(40, int(fig.get_figwidth() * 13))
    wrapped = "\n".join(textwrap.wrap(text, width))
    fig.draw_without_rendering()  # runs the layout engine once: the panels and legends get their place
    if fig.get_layout_engine() is not None:
        for leg in fig.legends:
            leg.set_bbox_to_anchor(matplotlib.transforms.Bbox.from_bounds(0.0, 0.0, 1.0, 1.0),
                                   transform=fig.transFigure)
        fig.set_layout_engine("none")
    bb = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, in the figure's frame
    w_in, h_in = fig.get_size_inches()
    x0, y0 = bb.x0 / w_in, bb.y0 / h_in - 0.06 / h_in  # under the lowest artist
    fig._topas_caption_artist = fig.text(x0, y0, wrapped, ha="left", va="top", fontsize=8, color="0.2")
    return fig._topas_caption_artist
