"""The compiled search (``topas.policies.topas_search_compiled``) makes the reference's decisions
(``PrefixSearch.search`` with ``_DecisionCtx._evaluate``), bit for bit: at every decision of every
pinned configuration (``tests/test_topas_pinned.py``) and a few more (the exhaustive search, local+
on a large pool, a host tier), the two return the same plan (prefix set, admissions with their
credits, preemptions, score and each term, the terms' Python types included) and count the same
prefix sets; the fused set-up (``topas_setup_fused``) leaves what the readable one does; the
reference alone (readable set-up and search) still gives the pinned decisions; a process loads the kernels
only once its searches have cost as much; and the kernels' sum is Python's ``sum()`` on the
interpreter that runs them."""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from topas.experiments import Experiment, run_experiment
from topas.policies import make_policy, topas_decision, topas_search_compiled, topas_setup_fused
from topas.policies.topas_decision import _DecisionCtx
from topas.policies.topas_search import PrefixSearch
from topas.policies.topas_search_compiled import CompiledSearch
from topas.policies.topas_task import _TaskCtx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_topas_pinned import EXPECTED, RUNS, digest  # noqa: E402

#: What the fused set-up leaves out: ``_DecisionCtx``'s attributes computed when first read.
DERIVED = {k for k, v in vars(_DecisionCtx).items() if isinstance(v, functools.cached_property)}

MORE = {
    "dag-10-wide/topas-exhaustive": Experiment("dag-10-wide", "topas", {"search": "exhaustive"}, load=1.5, seed=0,
                                               n_tasks=12),
    "metagpt-tl/topas-local+-M0": Experiment("metagpt-tl", "topas", {"search": "local+", "M": 0}, load=1.5, seed=1,
                                             n_tasks=15),
    "dag-4/topas-host-tier": Experiment("dag-4", "topas", {"move_cost": "engine"}, load=1.3, seed=0, n_tasks=40,
                                        engine_options={"eviction": "kvflow", "host_tier": True}),
    "chain-3/topas-no-aging-reprefill": Experiment("chain-3", "topas-no-aging", {"redo": "reprefill", "K": 2},
                                                   load=1.4, seed=0, n_tasks=40),
}


def _same_plan(fast, ref) -> None:
    assert fast.resident == ref.resident
    assert fast.admit == ref.admit and [type(g) for _, g in fast.admit] == [type(g) for _, g in ref.admit]
    assert fast.preempt == ref.preempt
    assert repr(fast.score) == repr(ref.score)
    assert list(fast.terms) == list(ref.terms)
    assert [(repr(v), type(v)) for v in fast.terms.values()] == [(repr(v), type(v)) for v in ref.terms.values()]


@pytest.mark.parametrize("name", sorted(RUNS) + sorted(MORE))
def test_the_compiled_search_decides_as_the_reference_at_every_decision(name, monkeypatch):
    exp = RUNS.get(name) or MORE[name]
    checked = []

    def both(self):
        fast, n_fast = CompiledSearch.search(self)
        self._memo = {}  # the liveness fallback's plans: the reference scores them afresh
        ref, n_ref = PrefixSearch.search(self)
        _same_plan(fast, ref)
        assert n_fast == n_ref
        checked.append(self._n_full)
        return ref, n_ref

    monkeypatch.setattr(topas_search_compiled, "ENABLED", True)
    monkeypatch.setattr(topas_search_compiled, "LOAD_AFTER_S", 0.0)
    monkeypatch.setattr(_DecisionCtx, "search", both)
    run_experiment(exp)
    if exp.policy != "topas-request-only":  # which orders requests, no search
        assert checked and sum(checked) > 0, "the compiled search never ran"


def _same(fast, ref, path: str) -> None:
    """``fast`` is ``ref``: the same type, float for float (repr), dicts in the same order."""
    assert type(fast) is type(ref), (path, type(fast), type(ref))
    if isinstance(ref, dict):
        assert list(fast) == list(ref), path
        for k in ref:
            _same(fast[k], ref[k], f"{path}[{k!r}]")
    elif isinstance(ref, (list, tuple)):
        assert len(fast) == len(ref), path
        for i, (x, y) in enumerate(zip(fast, ref)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(ref, float):
        assert repr(fast) == repr(ref), (path, fast, ref)
    elif isinstance(ref, np.ndarray):  # the "sampled" estimator's draws
        assert fast.dtype == ref.dtype and fast.tobytes() == ref.tobytes(), path
    elif isinstance(ref, _TaskCtx):
        for slot in _TaskCtx.__slots__:
            _same(getattr(fast, slot), getattr(ref, slot), f"{path}.{slot}")
    else:
        assert fast is ref or fast == ref, path


def _set_up_twice(monkeypatch, flag: str, init, ctx, policy, view):
    """The decision's set-up with ``topas_decision.<flag>`` off, into a new context (returned: the
    reference), then with it on, into ``ctx`` (the fast path under test)."""
    monkeypatch.setattr(topas_decision, flag, False)
    ref = _DecisionCtx.__new__(type(ctx))
    init(ref, policy, view)
    monkeypatch.setattr(topas_decision, flag, True)
    init(ctx, policy, view)
    return ref


@pytest.mark.parametrize("name", sorted(RUNS) + sorted(MORE))
def test_the_fused_set_up_leaves_what_the_readable_one_does_at_every_decision(name, monkeypatch):
    """``topas_setup_fused`` against ``_DecisionCtx._readable_setup``: every attribute of the
    decision's context (those it leaves out computed when read), at every decision (the configurations it does not cover run the readable
    set-up in both)."""
    exp = RUNS.get(name) or MORE[name]
    init = _DecisionCtx.__init__
    fused = []

    def both(self, policy, view):
        ref = _set_up_twice(monkeypatch, "FUSED", init, self, policy, view)
        assert "_compiled" not in vars(self)
        assert set(vars(self)) | DERIVED >= set(vars(ref))
        for k, v in vars(ref).items():  # what the fused set-up leaves out is computed as it is read
            _same(getattr(self, k), v, k)
        fused.append(topas_setup_fused.covers(policy.params))

    monkeypatch.setattr(topas_decision, "COMPILED", False)  # the fused set-up's own attributes
    monkeypatch.setattr(_DecisionCtx, "__init__", both)
    run_experiment(exp)
    assert fused
    if name in DEFAULTS:
        assert all(fused), "the fused set-up does not cover the default parameters"


DEFAULTS = ("dag-4/topas", "dag-10-wide/topas", "dag-4/topas-host-tier", "dag-10-wide/topas-exhaustive")


#: What the compiled set-up computes itself that the runs above leave out: g_i(t)'s linear form,
#: no aging, no revalued credit.
SET_UP = {
    "dag-4/topas-linear-aging": Experiment("dag-4", "topas", {"aging_form": "linear"}, load=1.3, seed=1, n_tasks=30),
    "dag-10-wide/topas-no-aging": Experiment("dag-10-wide", "topas-no-aging", {}, load=1.5, seed=1, n_tasks=12),
    "chain-3/topas-credit-as-recorded": Experiment("chain-3", "topas", {"revalue_credit": False}, load=1.4, seed=2,
                                                   n_tasks=30),
}


@pytest.mark.parametrize("name", sorted(RUNS) + sorted(MORE) + sorted(SET_UP))
def test_the_compiled_set_up_lays_out_what_the_fused_one_does_at_every_decision(name, monkeypatch):
    """``topas_setup_compiled`` against ``topas_setup_fused`` with ``_kernel_arrays``: the compiled
    search's two arrays element for element, the candidates in order with their gains (values and
    types), and what the compiled set-up leaves out, which the fused set-up computes when it is read,
    at every decision it runs (the configurations it does not cover run the fused or readable
    set-up in both)."""
    exp = RUNS.get(name) or MORE.get(name) or SET_UP[name]
    policy = make_policy(exp.policy, dict(exp.params))
    if not (topas_setup_fused.covers(policy.params) and policy.plans_admissions):
        pytest.skip("parameters the compiled set-up does not cover: the fused or readable set-up runs")
    monkeypatch.setattr(topas_search_compiled, "LOAD_AFTER_S", 0.0)
    topas_search_compiled.load()
    init = _DecisionCtx.__init__
    compiled = []

    def both(self, policy, view):
        ref = _set_up_twice(monkeypatch, "COMPILED", init, self, policy, view)
        fast = vars(self).get("_compiled")
        compiled.append(fast is not None)
        if fast is None:
            return
        names, waiting, ints, floats, cands, gain = fast[:6]
        r_ints, r_floats, r_names = ref._kernel_arrays()
        assert ints.dtype == r_ints.dtype and ints.tolist() == r_ints.tolist()
        assert floats.dtype == r_floats.dtype and floats.tobytes() == r_floats.tobytes()
        assert names == r_names
        packable = [(waiting[j].rid, waiting[j].agent, waiting[j].task_id, float(gain[j])) for j in cands.tolist()]
        _same(packable, [c[:4] for c in ref._packable], "_packable")
        for k, v in vars(ref).items():  # what the compiled set-up leaves out is computed as it is read
            _same(getattr(self, k), v, k)

    monkeypatch.setattr(_DecisionCtx, "__init__", both)
    run_experiment(exp)
    if name in DEFAULTS or name in SET_UP:
        assert compiled and all(compiled), "the compiled set-up does not cover these parameters"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_reference_search_alone_gives_the_pinned_decisions(name, monkeypatch):
    monkeypatch.setattr(topas_search_compiled, "ENABLED", False)
    monkeypatch.setattr(topas_decision, "FUSED", False)  # the readable set-up as well
    assert digest(RUNS[name]) == EXPECTED[name]


def test_the_kernels_sum_is_pythons_sum_on_this_interpreter():
    from topas.policies.topas_kernel_score import py_sum_add, py_sum_end

    rng = random.Random(0)
    for _ in range(3000):
        xs = [rng.choice([rng.uniform(-1, 1) * 10.0 ** rng.randint(-20, 20), 0.0, -0.0, 1e16, -1e16, 0.1])
              for _ in range(rng.randint(0, 9))]
        f = c = 0.0
        for x in xs:
            f, c = py_sum_add(f, c, x, topas_search_compiled.COMPENSATED)
        got = py_sum_end(f, c, topas_search_compiled.COMPENSATED)
        want = float(sum(xs))
        assert repr(got) == repr(want), xs


def test_a_process_searches_with_the_reference_until_its_searches_cost_more_than_loading(monkeypatch):
    monkeypatch.setattr(topas_search_compiled, "_kernel", None)
    monkeypatch.setattr(topas_search_compiled, "_reference_s", 0.0)
    monkeypatch.setattr(topas_search_compiled, "LOAD_AFTER_S", float("inf"))
    compiled_runs = []
    load = topas_search_compiled.load
    monkeypatch.setattr(topas_search_compiled, "load", lambda: compiled_runs.append(1) or load())
    exp = Experiment("dag-4", "topas", {}, load=1.0, seed=0, n_tasks=8)
    first = run_experiment(exp)
    assert not compiled_runs and topas_search_compiled._kernel is None and topas_search_compiled._reference_s > 0
    monkeypatch.setattr(topas_search_compiled, "LOAD_AFTER_S", 0.0)
    second = run_experiment(exp)
    assert compiled_runs and topas_search_compiled._kernel is not None
    assert first.decisions.drop(columns="wall_s").equals(second.decisions.drop(columns="wall_s"))


def test_a_decision_with_more_agents_than_a_bitmask_holds_runs_the_reference(monkeypatch):
    monkeypatch.setattr(topas_search_compiled, "LOAD_AFTER_S", 0.0)
    monkeypatch.setattr(topas_search_compiled, "MAX_AGENTS", 1)
    calls = []
    reference = PrefixSearch.search

    def counted(self):
        calls.append(1)
        return reference(self)

    monkeypatch.setattr(PrefixSearch, "search", counted)
    res = run_experiment(Experiment("dag-4", "topas", {}, load=1.0, seed=0, n_tasks=8))
    assert calls and len(res.tasks) == 8
