"""What SPF and TOPAS+ keep across decisions changes nothing they compute: a stage's residual time
from kept parts (``topas.policies.estimates.StageParts``) is, to the bit, the one
``stage_residual_time`` computes afresh, whatever the estimator has observed since; and with their
kept parts and SPF's kept task shapes they give, at every decision of a run, what they give with
both computed afresh."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from test_baselines import COST, _dag4_trace, engine_view, task_view
from topas.engine.cost import load_profile
from topas.engine.simulator import simulate
from topas.policies import make_policy
from topas.policies.estimates import OperatingPoint, OutputEstimator, StageParts, stage_residual_time
from topas.workload import synthetic

SINGLE = (("A", ()),)

step = st.one_of(
    st.tuples(st.just("observe"), st.sampled_from("ab"), st.integers(1, 2000)),
    st.tuples(st.just("ask"), st.sampled_from("ab"), st.integers(1, 3000), st.integers(0, 1500),
              st.sampled_from([50, 100, 700])),
    st.tuples(st.just("cost"), st.floats(0.5, 2.0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=40), st.sampled_from(["online", "prior"]))
def test_kept_parts_give_the_residual_computed_afresh(steps, kind):
    est = OutputEstimator(learn=kind == "online")
    parts = StageParts()
    cost = COST
    for s in steps:
        if s[0] == "observe":
            est.observe(s[1], s[2])
        elif s[0] == "cost":  # another cost model: its prefills are not the kept ones
            cost = dataclasses.replace(COST, prefill_c_new=COST.prefill_c_new * s[1])
        else:
            _, agent, x, g, prior = s
            view = dataclasses.replace(engine_view(1.0, {agent: prior}, [task_view("t", 0.0, SINGLE, {"A": agent})], []),
                                       cost=cost)
            op = OperatingPoint.of(view)
            stage = view.tasks["t"].stages["A"]
            stage = dataclasses.replace(stage, input_tokens=x)
            pv = view.prefixes[agent]
            kept = parts.prefill(view, x + g, pv.tokens) + parts.remaining(est, agent, pv.expected_output_tokens, g) * op.tpot
            assert kept == stage_residual_time(view, est, op, stage, g)


def _outputs(policy_name: str, method: str, reset: dict, trace, cost, monkeypatch) -> list:
    """What ``method`` returns at every decision of one run of ``policy_name``; before each call
    the attributes in ``reset`` are set afresh (name -> factory; empty: the policy keeps them)."""
    cls = type(make_policy(policy_name))
    original = getattr(cls, method)
    seen: list = []

    def recorded(self, view):
        for name, fresh in reset.items():
            setattr(self, name, fresh())
        out = original(self, view)
        seen.append(dict(out))
        return out

    monkeypatch.setattr(cls, method, recorded)
    simulate(trace, make_policy(policy_name), cost)
    monkeypatch.setattr(cls, method, original)
    return seen


def test_spf_and_topas_plus_decide_as_with_parts_computed_afresh(monkeypatch):
    trace, cost = _dag4_trace(), COST.with_budget(12_000)  # outputs of 16-256 tokens: the estimates move
    for name, method in (("spf", "task_paths"), ("topas-plus", "priorities")):
        kept = _outputs(name, method, {}, trace, cost, monkeypatch)
        fresh = _outputs(name, method, {"_parts": StageParts}, trace, cost, monkeypatch)
        assert len(kept) > 50 and kept == fresh, name


def test_spf_keeps_a_tasks_shape_only_while_its_view_is_the_same(monkeypatch):
    # Wide DAGs, stages finishing while their siblings wait: the remaining paths with the shapes
    # kept across decisions and with every shape computed afresh are the same at every decision.
    trace, cost = synthetic.generate("dag-10-wide", n_tasks=40, seed=3), load_profile("a100-80gb_qwen2.5-32b")
    kept = _outputs("spf", "task_paths", {}, trace, cost, monkeypatch)
    fresh = _outputs("spf", "task_paths", {"_shapes": dict}, trace, cost, monkeypatch)
    assert len(kept) > 100 and sum(len(p) > 1 for p in kept) > 50
    assert kept == fresh
