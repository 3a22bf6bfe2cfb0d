"""The search's two upper bounds are bounds: at real decisions of real runs, neither the screen
(per-agent sums, ``_DecisionCtx._screen``) nor ``_bound`` is ever below the score of the plan
GREEDYPACK finds for a prefix set, so rejecting a set by either never changes the decision
(``tests/test_topas_pinned.py`` pins the decisions themselves). Checked on the reference search,
whose memo holds the plans; the compiled search computes the same bounds
(``tests/test_topas_compiled.py``)."""

from __future__ import annotations

import pytest

from topas.experiments import Experiment, run_experiment
from topas.policies import topas_decision, topas_search_compiled
from topas.policies.topas_decision import _DecisionCtx

RUNS = [
    Experiment("dag-10-wide", "topas", {}, load=1.5, seed=0, n_tasks=20),
    Experiment("dag-4", "topas", {}, load=1.2, seed=1, n_tasks=30),
    Experiment("metagpt-tl", "topas", {"redo": "reprefill", "move_cost": "engine"}, load=1.5, seed=0, n_tasks=15),
    Experiment("chain-3", "topas-no-reuse", {}, load=1.3, seed=2, n_tasks=30),
]


@pytest.mark.parametrize("exp", RUNS, ids=lambda e: f"{e.workload}/{e.policy}")
def test_the_screen_and_the_bound_never_fall_below_a_prefix_sets_score(exp, monkeypatch):
    checked = []
    search = _DecisionCtx.search

    def checking_search(self):
        out = search(self)
        for key in list(self._memo):
            if key & self._force_bit:
                continue
            resident = frozenset(a for a, bit in self._bit.items() if key & bit)
            plan = self._evaluate(resident, False, sum(self.prefix_len[a] for a in resident))
            if plan is None:
                continue  # infeasible: rejected before either bound
            tokens, used, _n, _loads, s_w, s_a, _key = self._sums(resident)
            free = self.view.kv_budget - used
            screen = self._screen(free, s_w, s_a)
            dropped = [a for a in self._busy_order if a not in resident]
            preempt = [r for a in dropped for r in self.running_by_agent[a]]
            tasks = set().union(*(self._busy_tasks[a] for a in dropped)) if dropped else frozenset()
            bound = self._bound(resident, free, tasks, preempt, [self.move_in[a] for a in sorted(resident - self.r_t)],
                                [self.move_out[a] for a in sorted(self.r_t - resident)])
            assert screen >= plan.score and bound >= plan.score, (resident, screen, bound, plan.score)
            assert screen >= bound - 1e-9 * (abs(bound) + 1)  # the screen is the looser one
            checked.append(resident)
        return out

    monkeypatch.setattr(topas_search_compiled, "ENABLED", False)  # the reference's memo, screen and bound
    monkeypatch.setattr(topas_decision._DecisionCtx, "search", checking_search)
    run_experiment(exp)
    assert len(checked) > 50  # the runs exercise the search
