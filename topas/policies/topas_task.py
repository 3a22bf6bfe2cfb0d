"""One task during one TOPAS decision (``_TaskCtx``: its residual times, ``g_i(t)``,
``L_i(H, t)`` and the frontier's shares of ``g_i(t) * Delta_task``), and the output estimator
memoised until its next observation (``_MemoEstimator``), and the pending stages ``n_a(t)`` can
count, kept per task across decisions (``pending_stages``)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from topas.engine.view import RequestView, TaskView
from topas.policies.topas_terms import delta_task, expected_longest_path


class _TaskCtx:
    """One task during one decision: its unfinished stages, residual times and L_i(H) cache."""

    __slots__ = ("view", "order", "children", "position", "residual", "committed", "g", "_cache", "waiting", "share",
                 "norm", "scalar")

    def __init__(self, tv: TaskView, residual: dict[str, Any], committed: frozenset[str], g: float,
                 share: str = "residual", norm: str = "absolute", shape: "_Shape | None" = None,
                 scalar: bool | None = None) -> None:
        self.view = tv
        self.order, self.children, _, self.position = shape or task_shape(tv)
        #: every residual is a number (not the "sampled" estimator's draws)
        self.scalar = not any(isinstance(v, np.ndarray) for v in residual.values()) if scalar is None else scalar
        self.residual = residual
        self.committed = committed
        self.g = g
        self._cache: dict[frozenset[str], float] = {}
        self.waiting: list[RequestView] = []
        self.share = share  # TopasParams.sibling_share
        self.norm = norm  # TopasParams.admit_norm

    def L(self, h: frozenset[str]) -> float:
        """L_i(H, t)."""
        v = self._cache.get(h)
        if v is None:
            v = self._cache[h] = expected_longest_path(self.order, self.children, self.residual, h)
        return v

    def frontier_gains(self) -> list[tuple[RequestView, float]]:
        """Each waiting request's share of g_i(t) * Delta_task(F | H, t), F = the waiting stages
        (in topological order), split by ``share`` and, unless ``norm == "absolute"``, divided by
        L_i(H, t) (the caller rescales "remaining")."""
        waiting = self.waiting
        frontier = tuple(r.stage_id for r in waiting)
        if not frontier:
            return []
        total = self.g * delta_task(self.order, self.children, self.residual, self.committed, frontier, self.scalar)
        if self.norm != "absolute":
            remaining = self.L(self.committed)
            total = total / remaining if remaining > 0 else 0.0
        if len(frontier) == 1:
            return [(waiting[0], total)]
        if self.share == "equal":
            return [(r, total / len(frontier)) for r in waiting]
        if self.share == "last":
            return [(r, total if r is waiting[-1] else 0.0) for r in waiting]
        size = [float(np.mean(self.residual[s])) if isinstance(self.residual[s], np.ndarray)
                else self.residual[s] for s in frontier]
        norm = sum(size)
        return [(r, total * z / norm if norm > 0 else total / len(frontier)) for r, z in zip(waiting, size)]


_Shape = tuple[tuple[str, ...], dict[str, tuple[str, ...]], tuple[tuple[str, str, int], ...], dict[str, int]]


def task_shape(tv: TaskView) -> _Shape:
    """The task's unfinished stages in topological order, their children, each one's
    ``(stage id, agent, input tokens)`` and its position in the order: a function of the
    (immutable) view, so a policy keeps it while the view is unchanged (``task_shapes``)."""
    order = tuple(s for s in tv.topo_order if s not in tv.done)
    st = tv.stages
    return (order, {s: st[s].children for s in order}, tuple((s, st[s].agent, st[s].input_tokens) for s in order),
            {s: i for i, s in enumerate(order)})


def stage_residuals(shape: _Shape, running: Any, ready: Mapping[str, int], parts: Mapping[str, dict[tuple[int, int], tuple[float, float]]],
                    prefixes: Mapping[str, Any], prefill_time: Any, est: Any, tpot: float) -> dict[str, float]:
    """A task's unfinished stages' expected residual times at this decision's operating point:
    ``prefill + remaining output * tpot``, the two parts from ``parts`` (``Topas.residual_parts``,
    filled here where missing) by (input tokens, generated tokens so far, from ``ready``). A
    running stage (in ``running``) is in H, which takes no time: its residual is never read and
    not computed."""
    res: dict[str, float] = {}
    for s, agent, x in shape[2]:
        if s in running:
            continue
        y = ready.get(s, 0)
        d = parts[agent]
        pr = d.get((x, y))
        if pr is None:
            pv = prefixes[agent]
            pr = d[(x, y)] = (prefill_time(x + y, pv.tokens), est.expected_remaining(agent, pv.expected_output_tokens, y))
        res[s] = pr[0] + pr[1] * tpot
    return res


def task_shapes(memo: dict[str, tuple[TaskView, _Shape]], tasks: Mapping[str, TaskView],
                ids: Iterable[str]) -> tuple[dict[str, _Shape], dict[str, tuple[TaskView, _Shape]]]:
    """``task_shape`` of each task in ``ids``, from ``memo`` where the task's view is the one it
    was computed for, and the memo for the next decision (those tasks only)."""
    out: dict[str, _Shape] = {}
    carried: dict[str, tuple[TaskView, _Shape]] = {}
    for tid in ids:
        tv = tasks[tid]
        hit = memo.get(tid)
        if hit is None or hit[0] is not tv:
            hit = (tv, task_shape(tv))
        carried[tid] = hit
        out[tid] = hit[1]
    return out, carried


class _MemoEstimator:
    """The policy's output estimator with ``expected_remaining`` memoised (a function of the
    agent, its prior and the tokens generated, and of the observations so far: the memo is
    valid while ``est.version`` is unchanged, so it is carried across decisions until the next
    finish, see :meth:`current`)."""

    __slots__ = ("est", "_memo", "version")

    def __init__(self, est: Any) -> None:
        self.est = est
        self._memo: dict[tuple[str, float, int], float] = {}
        self.version = getattr(est, "version", None)

    @staticmethod
    def current(memo: "_MemoEstimator | None", est: Any) -> "_MemoEstimator":
        """``memo`` if it still holds for ``est`` (same estimator, no observation since), else a
        fresh one (an estimator without a ``version`` gets a fresh memo each time)."""
        if memo is not None and memo.est is est and memo.version is not None and memo.version == getattr(est, "version", None):
            return memo
        return _MemoEstimator(est)

    def expected_remaining(self, agent: str, prior: float, generated: int) -> float:
        key = (agent, prior, generated)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = self.est.expected_remaining(agent, prior, generated)
        return v

    def sample_remaining(self, *args: Any) -> np.ndarray:
        return self.est.sample_remaining(*args)


_Pending = list[tuple[str, tuple[str, ...]]]  # (agent, unfinished parent rids)


def pending_stages(memo: dict[str, Any], tasks: Mapping[str, TaskView],
                   ready: Mapping[str, Iterable[str]]) -> tuple[_Pending, dict[str, Any]]:
    """The pending stages ``n_a(t)`` can count for some Q' (``_task_pending`` of each task with a
    ready request; ``ready``: per task, the ids of its ready (waiting or running) stages), and
    the memo for the next decision.

    A task's pending stages are a function of its (immutable) view and its ready stages, so
    ``memo`` keeps them per task while both are unchanged: a finish or a newly reached stage
    gives the task a new view, an admission or a new ready stage a new ready set."""
    out: _Pending = []
    lists, carried = pending_lists(memo, tasks, ready)
    for pend in lists:
        out.extend(pend)
    return out, carried


def pending_lists(memo: dict[str, Any], tasks: Mapping[str, TaskView],
                  ready: Mapping[str, Iterable[str]]) -> tuple[list[_Pending], dict[str, Any]]:
    """``pending_stages``'s per-task lists, each the memo's own (the same object while the
    task's view and ready set are unchanged), and the memo for the next decision."""
    out: list[_Pending] = []
    carried: dict[str, Any] = {}
    for tid, sids in ready.items():
        tv = tasks[tid]
        hit = memo.get(tid)
        if hit is None or hit[0] is not tv:
            hit = (tv, {})
        carried[tid] = hit
        key = frozenset(sids)
        pend = hit[1].get(key)
        if pend is None:
            pend = hit[1][key] = _task_pending(tid, tv, list(sids), key)
        out.append(pend)
    return out, carried


def _task_pending(tid: str, tv: TaskView, ready: list[str], ready_set: frozenset[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The task's pending stages whose unfinished parents are all ready (waiting or running),
    as ``(agent, unfinished parent rids)``: the only stages ``n_a(t)`` can count for some Q'."""
    out: list[tuple[str, tuple[str, ...]]] = []
    done = tv.done
    seen: set[str] = set()
    for sid in ready:
        for s in tv.stages[sid].children:
            if s in done or s in ready_set or s in seen:
                continue
            seen.add(s)
            parents = tuple(q for q in tv.stages[s].parents if q not in done)
            if all(q in ready_set for q in parents):
                out.append((tv.stages[s].agent, tuple(f"{tid}/{q}" for q in parents)))
    return out
