"""Longest-remaining-path helpers (topas/workload/critical_path.py), checked by hand arithmetic
on DAG-4 and Chain-3 and by a property over random DAGs."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas.workload import dag4, longest_path_from, longest_remaining_path

# DAG-4: A -> {B, C} -> D
TOPO = ["A", "B", "C", "D"]
KIDS = {"A": ["B", "C"], "B": ["D"], "C": ["D"], "D": []}
TIMES = {"A": 1.0, "B": 2.0, "C": 5.0, "D": 1.0}


def test_dag4_longest_path_from_each_stage():
    # LP(D) = 1; LP(B) = 2 + 1 = 3; LP(C) = 5 + 1 = 6; LP(A) = 1 + max(3, 6) = 7
    assert longest_path_from(TOPO, KIDS, TIMES) == {"D": 1.0, "B": 3.0, "C": 6.0, "A": 7.0}


def test_dag4_longest_remaining_path():
    assert longest_remaining_path(TOPO, KIDS, TIMES) == 7.0  # A + C + D = 1 + 5 + 1
    assert longest_remaining_path(TOPO, KIDS, TIMES, zero={"A"}) == 6.0  # C + D
    assert longest_remaining_path(TOPO, KIDS, TIMES, zero={"A", "C"}) == 3.0  # B + D = 2 + 1
    assert longest_remaining_path(TOPO, KIDS, TIMES, zero=set(TOPO)) == 0.0


def test_time_of_may_be_a_callable():
    assert longest_remaining_path(TOPO, KIDS, lambda v: TIMES[v], zero=("A",)) == 6.0


def test_chain3_is_the_sum():
    topo, kids = ["A", "B", "C"], {"A": ["B"], "B": ["C"], "C": []}
    assert longest_remaining_path(topo, kids, {"A": 1.5, "B": 2.0, "C": 0.5}) == 4.0
    assert longest_remaining_path(topo, kids, {"A": 1.5, "B": 2.0, "C": 0.5}, zero={"A", "B"}) == 0.5


def test_empty_dag():
    assert longest_remaining_path([], {}, {}) == 0.0


def test_on_a_task_object():
    task = dag4(n_tasks=1).tasks[0]
    assert longest_remaining_path(task.topo_order, task.children, TIMES) == 7.0
    # in stage counts: the depth of DAG-4 is 3
    assert longest_remaining_path(task.topo_order, task.children, lambda v: 1.0) == 3.0


@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 8))
    names = [f"s{k}" for k in range(n)]
    edges = [(names[i], names[j]) for i, j in itertools.combinations(range(n), 2) if draw(st.booleans())]
    times = {v: draw(st.floats(0.0, 100.0, allow_nan=False)) for v in names}
    zero = {v for v in names if draw(st.booleans())}
    # declare stages in a random (still topological) order: a random linear extension
    g = nx.DiGraph()
    g.add_nodes_from(names)
    g.add_edges_from(edges)
    perm = draw(st.permutations(names))
    rank = {v: k for k, v in enumerate(perm)}
    topo = list(nx.lexicographical_topological_sort(g, key=rank.__getitem__))
    kids = {v: sorted(g.successors(v)) for v in names}
    return g, topo, kids, times, zero


@settings(max_examples=300, deadline=None)
@given(random_dags())
def test_longest_remaining_path_bounds(dag):
    g, topo, kids, times, zero = dag
    lp = longest_remaining_path(topo, kids, times)
    eps = 1e-9 * (1 + sum(times.values()))
    assert all(lp >= times[v] - eps for v in topo)  # >= every single stage's time
    assert lp <= sum(times.values()) + eps  # <= the sum of all
    # and equals the brute-force longest path
    for u, v in g.edges:
        g.edges[u, v]["w"] = times[u]
    sinks = [v for v in topo if not kids[v]]
    h = g.copy()
    for s in sinks:
        h.add_edge(s, "END", w=times[s])
    assert lp == pytest.approx(nx.dag_longest_path_length(h, weight="w"), abs=eps)
    # with zeroed stages: the same bounds over the remaining stages
    lz = longest_remaining_path(topo, kids, times, zero=zero)
    rest = [times[v] for v in topo if v not in zero]
    assert all(lz >= t - eps for t in rest)
    assert lz <= sum(rest) + eps
    assert lz <= lp + eps
