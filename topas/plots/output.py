"""Saving figures and tables: the output folder, atomic writes, markdown tables, overlapping text."""

from __future__ import annotations

import math
import numbers
import os
import uuid
from pathlib import Path
from typing import Any, Callable

import matplotlib
import pandas as pd

from topas.paths import REPO_ROOT
from topas.plots.captions import MEASURED_ON_ENV, measured_caption, place_caption  # noqa: F401 (re-exported)


# --- output ---------------------------------------------------------------------------------


#: Where figures go when no folder is named: an interactive session's scratch folder (git-ignored).
#: Only ``make reproduce`` / ``make figures`` (scripts/reproduce.py) name ``figures/``.
SCRATCH_FIGURES = REPO_ROOT / "scratch" / "figures"


def figures_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """Where figures and tables go: ``out_dir``, else ``$TOPAS_FIGURES``, else
    :data:`SCRATCH_FIGURES` (``<repo>/scratch/figures``: exploring never rewrites ``figures/``)."""
    if out_dir is None:
        env = os.environ.get("TOPAS_FIGURES")
        out_dir = env if env else SCRATCH_FIGURES
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

    Metadata dates are dropped so that re-rendering unchanged data gives the same PDF. With
    ``$TOPAS_MEASURED_ON`` set the figure gets a footnote ``measured on SGLang (<server>)``.
    """
    out = figures_dir(out_dir)
    place_caption(fig)
    caption = measured_caption()
    if caption and not any(caption.lower() in t.get_text().replace(chr(10), ' ').lower() for t in fig.texts):
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


#: Columns that hold a setting of the grid (a load in multiples of the nominal rate, a capacity or
#: its bracket on the load grid), not a measurement: written exactly (``0.875``, not ``0.9``).
EXACT_COLUMNS = frozenset({"load", "capacity", "lower", "upper", "seed_low", "seed_high", "baseline_capacity",
                           "baseline_upper"})


def to_markdown(df: pd.DataFrame, floatfmt: str = ",.1f") -> str:
    """A GitHub-flavoured Markdown table of ``df`` (no tabulate needed): numeric columns
    right-aligned, floats as ``floatfmt`` (those of :data:`EXACT_COLUMNS` as ``g``: grid settings
    are never rounded), missing values empty, ``|`` escaped."""
    cols = [str(c) for c in df.columns]
    fmts = ["g" if c in EXACT_COLUMNS else floatfmt for c in cols]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in df.columns]
    lines = [
        "| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    for row in df.itertuples(index=False, name=None):
        lines.append("| " + " | ".join(_fmt_cell(v, f) for v, f in zip(row, fmts)) + " |")
    return "\n".join(lines) + "\n"


def evidence_label(n_seeds: int) -> str | None:
    """What a table built from ``n_seeds`` arrival seeds per cell can claim, for its ``evidence``
    column: ``"indicative, one seed"`` below two seeds (no interval is possible), else ``None``
    (the table carries its own intervals or seed columns)."""
    if n_seeds < 1:
        raise ValueError(f"evidence_label: n_seeds must be >= 1, got {n_seeds!r}")
    return "indicative, one seed" if n_seeds == 1 else None


def save_table(
    df: pd.DataFrame, name: str, out_dir: str | os.PathLike | None = None, floatfmt: str = ",.1f",
    evidence: str | None = None,
) -> list[Path]:
    """Write ``<out_dir>/<name>.csv`` (full precision) and ``<name>.md`` atomically; return both paths.
    ``evidence`` (e.g. :func:`evidence_label`'s ``"indicative, one seed"``) becomes the table's first
    column, on every row, so the label travels with the numbers."""
    if evidence is not None:
        df = df.copy()
        df.insert(0, "evidence", evidence)
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
    a readable figure returns ``[]``). Texts inside one legend are compared as well; a caption
    given by :func:`topas.plots.add_caption` is placed first, so it is checked too."""
    place_caption(fig)
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
