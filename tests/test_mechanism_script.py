"""scripts/mechanism.py (the README's mechanism numbers) runs and reports every column it promises."""

from __future__ import annotations

import importlib.util

from topas.paths import REPO_ROOT


def load_script():
    spec = importlib.util.spec_from_file_location("mechanism", REPO_ROOT / "scripts" / "mechanism.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mechanism_table_has_a_row_per_policy_and_a_queue_column_per_stage(capsys):
    mod = load_script()
    assert mod.main(["dag-4", "--policies", "fcfs", "topas", "--tasks", "15"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[1]
    for col in ("mean JCT", "p99 JCT", "busy/makespan", "decode batch", "prefix KV share",
                "retractions", "preemptions", "prefix swaps", "queue A", "queue B", "queue C", "queue D"):
        assert col in header
    assert any(line.startswith("fcfs") for line in lines) and any(line.startswith("topas") for line in lines)


def test_prefix_share_is_the_time_weighted_fraction_of_the_budget():
    import pandas as pd

    from topas.engine.metrics import SimResult

    mod = load_script()
    # 100 tokens held for 1 s, then 300 for 3 s (the last sample closes the interval): (100 + 900) / 4 / 1000
    tl = pd.DataFrame({"time": [0.0, 1.0, 4.0], "prefix_tokens": [100, 300, 0], "request_tokens": [0, 0, 0],
                       "decode_batch": [0, 0, 0], "prefill_queue": [0, 0, 0], "waiting": [0, 0, 0]})
    empty = pd.DataFrame()
    res = SimResult(empty, empty, empty, tl, empty)
    assert mod.prefix_share(res, 1000) == 0.25
