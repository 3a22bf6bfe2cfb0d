"""The MetaGPT cache study: the same runs with agent prefixes as the only shared KV and with the
segment radix tree, compared under the protocol (evaluation seeds, paired intervals)."""

from __future__ import annotations

import pandas as pd

from studies.cache_study import CACHES, POLICIES, cache_study_grid, cache_study_tables
from topas.experiments.protocol.seeds import EVALUATION_SEEDS, TUNING_SEEDS


def test_the_grid_runs_every_policy_under_both_caches_on_evaluation_seeds_only():
    exps = cache_study_grid(("metagpt-sop",), quick=True)
    assert {e.seed for e in exps} <= set(EVALUATION_SEEDS) and not {e.seed for e in exps} & set(TUNING_SEEDS)
    assert {e.policy for e in exps} == set(POLICIES)
    assert {dict(e.engine_options).get("segment_cache", True) for e in exps} == set(CACHES.values())


def test_the_radix_tree_serves_more_of_sops_prompts_and_every_comparison_has_a_verdict(tmp_path):
    runs, verdict = cache_study_tables(("metagpt-sop",), quick=True, store=tmp_path / "store")
    share = runs.pivot(index="policy", columns="cache", values="cached_pct")
    assert (share["segment radix tree"] > share["agent prefixes only"] + 20).all(), share
    assert len(verdict) == 2 * (len(POLICIES) - 1)
    for _, row in verdict.iterrows():
        if row["verdict"] in ("win", "tie", "loss"):
            assert row["low_s"] <= row["difference_s"] <= row["high_s"]
            assert (row["verdict"] == "tie") == (row["low_s"] <= 0 <= row["high_s"])
        else:
            assert row["verdict"].startswith("not compared:") and pd.isna(row["difference_s"])
