"""A table at one load marks each run past its policy's certified capacity as overload."""

import pandas as pd

from studies.protocol_runs.overload_marks import mark_overload


def test_each_run_is_marked_against_its_policy_s_certified_capacity(tmp_path):
    table = tmp_path / "capacity_table.csv"
    pd.DataFrame({"workload": ["dag-4", "dag-4", "w"], "policy": ["topas", "lpm", "spf"],
                  "capacity": [1.125, 1.375, float("nan")], "upper": [1.25, 1.5, 0.75]}).to_csv(table, index=False)
    runs = pd.DataFrame({"workload": ["dag-4", "dag-4", "w", "dag-4"], "policy": ["topas", "lpm", "spf", "parrot-fcfs"],
                         "mean JCT": [1.0, 2.0, 3.0, 4.0]})
    out = mark_overload(runs, 1.2, table)
    assert list(out.columns) == ["workload", "policy", "capacity", "mean JCT"]
    assert list(out["capacity"]) == ["overload (capacity 1.125x)", "within capacity (1.375x)",
                                     "overload (no certified capacity: rejected at 0.75x)",
                                     "not in the protocol's table"]
    assert list(mark_overload(runs, 1.2, tmp_path / "none.csv")["capacity"]) == ["capacity table missing"] * 4
