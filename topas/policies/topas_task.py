"""One task during one TOPAS decision (``_TaskCtx``: its residual times, ``g_i(t)``,
``L_i(H, t)`` and the frontier's shares of ``g_i(t) * Delta_task``), and the output estimator
memoised for one decision (``_MemoEstimator``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from topas.engine.view import RequestView, TaskView
from topas.policies.topas_terms import expected_longest_path


class _TaskCtx:
    """One task during one decision: its unfinished stages, residual times and L_i(H) cache."""

    __slots__ = ("view", "order", "children", "residual", "committed", "g", "_cache", "waiting", "share", "norm")

    def __init__(self, tv: TaskView, residual: dict[str, Any], committed: frozenset[str], g: float,
                 share: str = "residual", norm: str = "absolute") -> None:
        self.view = tv
        self.order = tuple(s for s in tv.topo_order if s not in tv.done)
        self.children = {s: tv.stages[s].children for s in self.order}
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

    def gain(self, h: frozenset[str], stages: tuple[str, ...]) -> float:
        """g_i(t) * Delta_task(stages | H, t)."""
        return self.g * (self.L(h) - self.L(h | frozenset(stages)))

    def frontier_gains(self) -> dict[str, float]:
        """Each waiting stage's share of g_i(t) * Delta_task(F | H, t), F = the waiting stages
        (in topological order), split by ``share`` and, unless ``norm == "absolute"``, divided by
        L_i(H, t) (the caller rescales "remaining")."""
        frontier = tuple(r.stage_id for r in self.waiting)
        if not frontier:
            return {}
        total = self.gain(self.committed, frontier)
        if self.norm != "absolute":
            remaining = self.L(self.committed)
            total = total / remaining if remaining > 0 else 0.0
        if len(frontier) == 1:
            return {frontier[0]: total}
        if self.share == "equal":
            return {s: total / len(frontier) for s in frontier}
        if self.share == "last":
            return {s: total if s == frontier[-1] else 0.0 for s in frontier}
        size = {s: float(np.mean(self.residual[s])) if isinstance(self.residual[s], np.ndarray)
                else self.residual[s] for s in frontier}
        norm = sum(size.values())
        return {s: total * size[s] / norm if norm > 0 else total / len(frontier) for s in frontier}


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
