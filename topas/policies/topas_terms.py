"""TOPAS's utility, term by term (docs/method.md), as pure functions.

    Score(R', Q') = J_admit - J_move - J_redo - J_revoke + V_reuse      (all in seconds)

Each function names the paper's symbol it computes. The policy (``topas.policies.topas``)
assembles them; these functions know nothing about engines or views.

Our reading of ``H`` (docs/method.md): the set of the task's stages already committed (running, or
admitted earlier in the same decision). Committed stages contribute no remaining wait, so
``L_i(H, t)`` is the expected longest path over the task's unfinished stages not in ``H``, and
``Delta_task(r | H, t) = L_i(H, t) - L_i(H + {r}, t)`` is how much of the task's remaining
critical path admitting ``r`` commits.
"""

from __future__ import annotations

import math
from typing import Collection, Iterable, Mapping, Sequence

import numpy as np


def aging(t: float, tau: float, rho: float, h_age: float, form: str = "log") -> float:
    """``g_i(t) = 1 + rho * log(1 + (t - tau_i) / H_age)`` (``form="log"``, the paper's), or
    ``1 + rho * (t - tau_i) / H_age`` (``form="linear"``, a reading parameter); scales only the
    admission term."""
    x = max(t - tau, 0.0) / h_age
    if form == "log":
        return 1.0 + rho * math.log1p(x)
    if form == "linear":
        return 1.0 + rho * x
    raise ValueError(f"aging form {form!r} is not one of ('log', 'linear')")


def expected_longest_path(
    topo_order: Sequence[str],
    children: Mapping[str, Sequence[str]],
    residual: Mapping[str, float | np.ndarray],
    committed: Collection[str] = (),
) -> float:
    """``L_i(H, t) = E[LP(G_i, Z_i)]`` over the stages in ``topo_order`` (the unfinished ones).

    ``residual[v]`` is either a number (the "expected" estimator: the longest path over expected
    residuals, a lower bound of E[max] by Jensen) or an array of S draws (the "sampled"
    estimator: the mean over draws of the longest path, i.e. a Monte-Carlo E[LP]). Stages in
    ``committed`` (H) take no time. Children outside ``topo_order`` (finished) are ignored.
    """
    if not any(isinstance(residual[v], np.ndarray) for v in topo_order if v not in committed):
        return _longest_path_scalar(topo_order, children, residual, committed)
    lp: dict[str, float | np.ndarray] = {}
    best: float | np.ndarray = 0.0
    for v in reversed(topo_order):
        tail: float | np.ndarray = 0.0
        for c in children[v]:
            if c in lp:
                tail = np.maximum(tail, lp[c])
        z = 0.0 if v in committed else residual[v]
        lp[v] = z + tail
        best = np.maximum(best, lp[v])
    return float(np.mean(best))


def _longest_path_scalar(topo_order, children, residual, committed) -> float:
    lp: dict[str, float] = {}
    best = 0.0
    for v in reversed(topo_order):
        tail = 0.0
        for c in children[v]:
            t = lp.get(c)
            if t is not None and t > tail:
                tail = t
        val = lp[v] = (0.0 if v in committed else residual[v]) + tail
        if val > best:
            best = val
    return best


def longest_path_pair(
    topo_order: Sequence[str],
    children: Mapping[str, Sequence[str]],
    residual: Mapping[str, float],
    committed: Collection[str],
    admitted: Collection[str],
) -> tuple[float, float]:
    """``(L_i(H, t), L_i(H + admitted, t))`` for scalar residuals, in one pass: each is the
    number :func:`expected_longest_path` computes, by the same operations in the same order."""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    best_b = best_a = 0.0
    for v in reversed(topo_order):
        tail_b = tail_a = 0.0
        for c in children[v]:
            t = before.get(c)
            if t is not None:
                if t > tail_b:
                    tail_b = t
                t = after[c]
                if t > tail_a:
                    tail_a = t
        if v in committed:
            val_b = before[v] = 0.0 + tail_b
            val_a = after[v] = 0.0 + tail_a
        else:
            z = residual[v]
            val_b = before[v] = z + tail_b
            val_a = after[v] = (0.0 if v in admitted else z) + tail_a
        if val_b > best_b:
            best_b = val_b
        if val_a > best_a:
            best_a = val_a
    return best_b, best_a


def delta_task(
    topo_order: Sequence[str],
    children: Mapping[str, Sequence[str]],
    residual: Mapping[str, float | np.ndarray],
    committed: Collection[str],
    admitted: Collection[str],
    scalar: bool | None = None,
) -> float:
    """``Delta_task(r | H, t) = L_i(H, t) - L_i(H + {r}, t)``, for one or several stages ``r``.

    With several stages this is the sequentially conditioned sum of their Deltas (the sum
    telescopes, so the order does not matter). ``scalar``: whether every residual is a number
    (None: look); then both longest paths come from one pass (:func:`longest_path_pair`).
    """
    if scalar is None:
        scalar = not any(isinstance(residual[v], np.ndarray) for v in topo_order)
    if scalar:
        before, after = longest_path_pair(topo_order, children, residual, committed, admitted)
        return before - after
    h = set(committed)
    before = expected_longest_path(topo_order, children, residual, h)
    after = expected_longest_path(topo_order, children, residual, h | set(admitted))
    return before - after


def j_admit(gains: Iterable[float]) -> float:
    """``J_admit``: the sum over admitted requests of ``g_i(t) * Delta_task(r | H, t)``."""
    return float(sum(gains))


def j_move(move_in_times: Iterable[float], move_out_times: Iterable[float], affected_tasks: int) -> float:
    """``J_move = (mu / B_swap) * (sum l_a out + sum l_a in)``, charged ``|T_in|`` times.

    Times come from the cost model: a swap is ``mu * l_a / B_swap`` (+ latency); a load with no
    host copy is a prefill of ``l_a`` tokens; an eviction with a host copy is free. Every task
    with a request in the post-decision running set ``Q'`` waits for the moves (the engine
    serialises moves with compute), so ``|T_in|`` = the number of those tasks (our reading);
    with no such task the move is still charged once (it occupies the GPU all the same).
    """
    return (sum(move_in_times) + sum(move_out_times)) * max(affected_tasks, 1)


def j_redo(generated_tokens: Iterable[int], t_decode: float) -> float:
    """``J_redo = sum over preempted r of T_decode * y_r(t)``: generated tokens to rebuild."""
    return t_decode * sum(generated_tokens)


def j_redo_reprefill(prefill_times: Iterable[float], rewait_times: Iterable[float]) -> float:
    """``J_redo`` as the engine pays it (reading ``redo="reprefill"``): each preempted ``r`` is
    rebuilt by one prefill of its suffix input + ``y_r(t)`` generated tokens on its cached prefix
    (``prefill_times``), after waiting again to be readmitted (``rewait_times``)."""
    return float(sum(prefill_times)) + float(sum(rewait_times))


def j_revoke(credits: Iterable[float]) -> float:
    """``J_revoke = sum over preempted r of lambda_r``, the credit recorded at r's admission."""
    return float(sum(credits))


def v_reuse(beta: float, lookahead: Mapping[str, int], reload_time: Mapping[str, float], resident: Iterable[str]) -> float:
    """``V_reuse = beta * sum_{a in R'} n_a(t) * mu * l_a / B_swap``.

    ``lookahead[a]`` is ``n_a(t)``; ``reload_time[a]`` the time to bring ``a`` back
    (``mu * l_a / B_swap`` from the host tier).
    """
    return beta * sum(lookahead.get(a, 0) * reload_time[a] for a in resident)


def lookahead_counts(
    pending: Iterable[tuple[str, Collection[str]]],
    running: Collection[str],
) -> dict[str, int]:
    """``n_a(t)``: next-hop stages of agent ``a`` whose only unfinished predecessors are running.

    ``pending`` yields ``(agent, unfinished_parent_rids)`` for every stage that is not yet
    ready; ``running`` is the set of request ids running after the decision (Q', our reading of
    "currently running" for a post-decision state).
    """
    counts: dict[str, int] = {}
    for agent, parents in pending:
        if parents and all(p in running for p in parents):
            counts[agent] = counts.get(agent, 0) + 1
    return counts
