"""Marking runs past a policy's certified capacity: a table's rows get the protocol's verdict on
their load (``figures/capacity_table.csv``, notebook 16), so a table shown at one load says which
of its runs are in overload (their JCT grows with the run's length and is no latency claim)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from topas.paths import REPO_ROOT

#: The protocol's capacity table (notebook 16, ``make reproduce``).
CAPACITY_TABLE = REPO_ROOT / "figures" / "capacity_table.csv"


def capacity_status(workload: str, policy: str, load: float, table: pd.DataFrame) -> str:
    """``"overload (capacity 1.125x)"``, ``"within capacity (1.375x)"``, ``"overload (no certified
    capacity: rejected at 0.75x)"`` or ``"not in the protocol's table"``."""
    row = table[(table["workload"] == workload) & (table["policy"] == policy)]
    if row.empty:
        return "not in the protocol's table"
    cap, upper = row["capacity"].iloc[0], row["upper"].iloc[0]
    if pd.isna(cap):
        return f"overload (no certified capacity: rejected at {upper:g}x)"
    return f"overload (capacity {cap:g}x)" if load > cap else f"within capacity ({cap:g}x)"


def mark_overload(df: pd.DataFrame, load: float, capacity_table: Path = CAPACITY_TABLE) -> pd.DataFrame:
    """``df`` (``workload`` and ``policy`` columns, all run at ``load``) with a ``capacity`` column
    after ``policy``: each row's :func:`capacity_status`; ``"capacity table missing"`` without
    the table (run notebook 16 or ``make reproduce``)."""
    out = df.copy()
    if Path(capacity_table).is_file():
        table = pd.read_csv(capacity_table)
        status = [capacity_status(w, p, load, table) for w, p in zip(out["workload"], out["policy"])]
    else:
        status = ["capacity table missing"] * len(out)
    out.insert(list(out.columns).index("policy") + 1, "capacity", status)
    return out
