"""TOPAS's utility terms (topas/policies/topas_terms.py), each a pure function, checked against
numbers worked out by hand on 2-4 stage DAGs. Every expected value is derived in the comments.

    Score(R', Q') = J_admit - J_move - J_redo - J_revoke + V_reuse      (docs/method.md)
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from topas.policies.topas_terms import (
    aging,
    delta_task,
    expected_longest_path,
    j_admit,
    j_move,
    j_redo,
    j_revoke,
    lookahead_counts,
    v_reuse,
)

# DAG shapes as (topological order, children). Stage ids are the agents' names, too.
CHAIN3 = (("A", "B", "C"), {"A": ("B",), "B": ("C",), "C": ()})
DAG4 = (("A", "B", "C", "D"), {"A": ("B", "C"), "B": ("D",), "C": ("D",), "D": ()})


# ------------------------------------------------------------------------------------ aging
def test_aging_is_one_plus_rho_log_of_the_wait_over_the_horizon():
    # g = 1 + rho * ln(1 + (t - tau) / H_age)
    # rho = 1, H_age = 60, waited 60 s: 1 + ln(1 + 1) = 1 + ln 2
    assert aging(t=60.0, tau=0.0, rho=1.0, h_age=60.0) == pytest.approx(1 + math.log(2))
    # the same wait starting later: only t - tau matters
    assert aging(t=160.0, tau=100.0, rho=1.0, h_age=60.0) == pytest.approx(1 + math.log(2))
    # rho = 2, waited 180 s: 1 + 2 * ln(1 + 3) = 1 + 2 ln 4
    assert aging(t=180.0, tau=0.0, rho=2.0, h_age=60.0) == pytest.approx(1 + 2 * math.log(4))
    # H_age = 10, waited 90 s: 1 + ln 10
    assert aging(t=90.0, tau=0.0, rho=1.0, h_age=10.0) == pytest.approx(1 + math.log(10))


def test_aging_is_one_for_a_new_task_or_rho_zero_and_grows_with_the_wait():
    assert aging(t=5.0, tau=5.0, rho=1.0, h_age=60.0) == 1.0   # no wait: ln 1 = 0
    assert aging(t=500.0, tau=0.0, rho=0.0, h_age=60.0) == 1.0  # aging switched off
    assert aging(t=4.0, tau=5.0, rho=1.0, h_age=60.0) == 1.0   # a clock before tau is clamped
    g = [aging(t, 0.0, 1.0, 60.0) for t in (0.0, 1.0, 10.0, 100.0, 1000.0)]
    assert g == sorted(g) and len(set(g)) == len(g)  # strictly increasing, and unbounded but slow


# ------------------------------------------------------------------------ expected longest path
def test_longest_path_of_a_chain_is_the_sum_and_committed_stages_count_zero():
    order, kids = CHAIN3
    z = {"A": 1.0, "B": 2.0, "C": 3.0}
    assert expected_longest_path(order, kids, z) == pytest.approx(6.0)  # 1 + 2 + 3
    assert expected_longest_path(order, kids, z, committed={"A"}) == pytest.approx(5.0)  # 0 + 2 + 3
    assert expected_longest_path(order, kids, z, committed={"B"}) == pytest.approx(4.0)  # 1 + 0 + 3
    assert expected_longest_path(order, kids, z, committed={"A", "B", "C"}) == 0.0


def test_longest_path_ignores_finished_stages_outside_the_order():
    # Chain-3 with A finished: the order lists B, C only; A's residual is not even given.
    _, kids = CHAIN3
    assert expected_longest_path(("B", "C"), kids, {"B": 2.0, "C": 3.0}) == pytest.approx(5.0)
    # Children outside the order are ignored (C listed as a child but not in the order, so not
    # looked up): A + B = 1 + 2 = 3.
    assert expected_longest_path(("A", "B"), kids, {"A": 1.0, "B": 2.0}) == pytest.approx(3.0)


def test_longest_path_of_dag4_takes_the_longer_branch():
    order, kids = DAG4
    z = {"A": 1.0, "B": 4.0, "C": 2.0, "D": 3.0}
    # A + max(B, C) + D = 1 + 4 + 3 = 8 (not the total work 10)
    assert expected_longest_path(order, kids, z) == pytest.approx(8.0)
    # B committed (running): A + max(0, 2) + 3 = 6
    assert expected_longest_path(order, kids, z, committed={"B"}) == pytest.approx(6.0)
    # A and B committed: max(0 + 3, 2 + 3) = 5 (a committed stage still leads to its children)
    assert expected_longest_path(order, kids, z, committed={"A", "B"}) == pytest.approx(5.0)
    # A finished (out of the order), B and C are both roots: max(4, 2) + 3 = 7
    assert expected_longest_path(("B", "C", "D"), kids, z) == pytest.approx(7.0)


def test_sampled_longest_path_is_the_mean_of_per_draw_longest_paths():
    # DAG-4 with A finished; B and C in parallel, two draws each, D fixed at 1:
    #   draw 0: B = 1, C = 3 -> max 3 (+1) = 4
    #   draw 1: B = 3, C = 1 -> max 3 (+1) = 4
    # E[LP] = mean(4, 4) = 4, while the longest path of the means is max(2, 2) + 1 = 3.
    _, kids = DAG4
    draws = {"B": np.array([1.0, 3.0]), "C": np.array([3.0, 1.0]), "D": 1.0}
    means = {"B": 2.0, "C": 2.0, "D": 1.0}
    e_max = expected_longest_path(("B", "C", "D"), kids, draws)
    max_e = expected_longest_path(("B", "C", "D"), kids, means)
    assert e_max == pytest.approx(4.0)
    assert max_e == pytest.approx(3.0)
    assert e_max > max_e  # Jensen: E[max] >= max E, strictly here
    # A chain is linear: sampled == expected (mean of sums = sum of means): (1+3)/2 + 1 = 3
    _, kids3 = CHAIN3
    assert expected_longest_path(("B", "C"), kids3, {"B": np.array([1.0, 3.0]), "C": 1.0}) == pytest.approx(3.0)


def test_sampled_longest_path_with_committed_stage_and_random_draws_dominates_the_means():
    rng = np.random.default_rng(0)
    order, kids = DAG4
    draws = {s: rng.exponential(1.0 + k, size=64) for k, s in enumerate(order)}
    means = {s: float(np.mean(v)) for s, v in draws.items()}
    for h in (set(), {"A"}, {"B"}, {"A", "C"}):
        assert expected_longest_path(order, kids, draws, h) >= expected_longest_path(order, kids, means, h) - 1e-12


# ---------------------------------------------------------------------------------- Delta_task
def test_delta_task_on_a_chain_is_the_admitted_stage_time():
    order, kids = CHAIN3
    z = {"A": 1.0, "B": 2.0, "C": 3.0}
    # head admitted: L(H={}) - L(H={A}) = 6 - 5 = 1 = z_A
    assert delta_task(order, kids, z, committed=(), admitted=["A"]) == pytest.approx(1.0)
    # Only B, C left (A finished), B admitted: (2 + 3) - 3 = 2 = z_B
    assert delta_task(("B", "C"), kids, z, committed=(), admitted=["B"]) == pytest.approx(2.0)
    # Already committed: admitting it again gains nothing
    assert delta_task(order, kids, z, committed={"A"}, admitted=["A"]) == 0.0


def test_delta_task_of_one_of_two_equal_parallel_branches_is_zero_both_together_the_branch():
    # DAG-4 with A finished, B and C equal (2 s each), D 3 s. L = max(2, 2) + 3 = 5.
    _, kids = DAG4
    order = ("B", "C", "D")
    z = {"B": 2.0, "C": 2.0, "D": 3.0}
    # B alone: max(0, 2) + 3 = 5 -> Delta = 0 (the documented tie: the other branch still binds)
    assert delta_task(order, kids, z, (), ["B"]) == 0.0
    assert delta_task(order, kids, z, (), ["C"]) == 0.0
    # both: max(0, 0) + 3 = 3 -> Delta = 2, the branch time
    assert delta_task(order, kids, z, (), ["B", "C"]) == pytest.approx(2.0)
    # sequential conditioning telescopes: Delta(B | {}) + Delta(C | {B}) = 0 + 2
    assert delta_task(order, kids, z, (), ["B"]) + delta_task(order, kids, z, {"B"}, ["C"]) == pytest.approx(2.0)
    # ... in either order: Delta(C | {}) + Delta(B | {C}) = 0 + 2
    assert delta_task(order, kids, z, (), ["C"]) + delta_task(order, kids, z, {"C"}, ["B"]) == pytest.approx(2.0)


def test_delta_task_of_unequal_branches_counts_only_the_excess_of_the_longer():
    # B = 4, C = 1, D = 3: L = 7. Admitting B: max(0, 1) + 3 = 4 -> 3 = 4 - 1 (C now binds).
    # Admitting C: still 7 -> 0.
    _, kids = DAG4
    z = {"B": 4.0, "C": 1.0, "D": 3.0}
    assert delta_task(("B", "C", "D"), kids, z, (), ["B"]) == pytest.approx(3.0)
    assert delta_task(("B", "C", "D"), kids, z, (), ["C"]) == 0.0


# ---------------------------------------------------------------------------- the cost terms
def test_j_admit_sums_the_gains():
    assert j_admit([1.5, 0.25, 2.0]) == pytest.approx(3.75)
    assert j_admit([]) == 0.0


def test_j_move_is_the_move_time_times_the_affected_tasks():
    # in: 0.1 + 0.2, out: 0.3 -> 0.6 s of moves; 3 tasks wait for them -> 1.8 s
    assert j_move([0.1, 0.2], [0.3], affected_tasks=3) == pytest.approx(1.8)
    # an eviction to an existing host copy is free (time 0) and costs nothing, whatever the tasks
    assert j_move([], [0.0], affected_tasks=5) == 0.0
    # no task in Q' waits for the moves: the GPU time is still charged once (1.0 s)
    assert j_move([0.5], [0.5], affected_tasks=0) == pytest.approx(1.0)


def test_j_redo_charges_a_decode_step_per_generated_token():
    # two preempted requests with 10 and 30 generated tokens at 10 ms/token: 0.4 s
    assert j_redo([10, 30], t_decode=0.01) == pytest.approx(0.4)
    assert j_redo([], t_decode=0.01) == 0.0
    assert j_redo([0], t_decode=0.01) == 0.0  # a request preempted before its first token


def test_j_revoke_returns_the_recorded_credits():
    assert j_revoke([1.5, 0.5]) == pytest.approx(2.0)
    assert j_revoke([]) == 0.0


def test_v_reuse_counts_only_agents_in_the_post_decision_prefix_set():
    # beta = 0.5; n_a = 2, n_b = 1, n_c = 4; reload times a 0.1, b 0.2, c 1.0, d 3.0
    look = {"a": 2, "b": 1, "c": 4}
    reload = {"a": 0.1, "b": 0.2, "c": 1.0, "d": 3.0}
    # R' = {a, b}: 0.5 * (2 * 0.1 + 1 * 0.2) = 0.2; c (not in R') does not count
    assert v_reuse(0.5, look, reload, {"a", "b"}) == pytest.approx(0.2)
    # R' = {a, d}: d has no next-hop stage (n_d = 0): 0.5 * 2 * 0.1 = 0.1
    assert v_reuse(0.5, look, reload, {"a", "d"}) == pytest.approx(0.1)
    # R' = {c}: 0.5 * 4 * 1.0 = 2
    assert v_reuse(0.5, look, reload, {"c"}) == pytest.approx(2.0)
    assert v_reuse(0.0, look, reload, {"a", "b", "c"}) == 0.0
    assert v_reuse(1.0, look, reload, set()) == 0.0


def test_lookahead_counts_a_stage_only_if_all_its_unfinished_parents_run():
    # pending stages: (agent, unfinished parents)
    pending = [
        ("x", ("t1/A",)),          # t1: A -> (x)
        ("y", ("t1/A", "t1/B")),   # t1: {A, B} -> (y)
        ("x", ("t2/C",)),          # t2: C -> (x)
        ("z", ("t3/A",)),          # t3: A -> (z)
    ]
    # only t1/A runs: x (first) counts; y does not (B does not run); t2's x, z do not
    assert lookahead_counts(pending, {"t1/A"}) == {"x": 1}
    # A and B run: y counts as well
    assert lookahead_counts(pending, {"t1/A", "t1/B"}) == {"x": 1, "y": 1}
    # t1/A and t2/C run: two next-hop stages of x
    assert lookahead_counts(pending, {"t1/A", "t2/C"}) == {"x": 2}
    assert lookahead_counts(pending, set()) == {}
    # a stage with no unfinished parent is ready, not a next hop: never counted
    assert lookahead_counts([("w", ())], {"t1/A"}) == {}
