"""TOPAS's decision state kept across decisions: the parts of a decision's set-up
(``topas_decision._DecisionCtx``) that change little between consecutive scheduling points,
updated from what changed between consecutive views instead of rebuilt from each view.

The view stays the contract for what TOPAS may know (nothing from the future, no true lengths):
the state is a cache of it. Every entry is a function of the current view, the policy's
parameters, its output estimator and the cost model, recomputed when its inputs differ from
those it was computed from; :func:`rebuilt` computes the same state from scratch and
:meth:`DecisionState.check` compares the two (``tests/test_topas_state.py`` does at every
decision of several runs, and so does any run with ``TOPAS_CHECK_STATE=1`` in the environment).

Kept:

* per agent (:meth:`DecisionState.agents`): ``l_a``, the prefix moves' times that J_move charges
  (``move_in``, ``move_out``), V_reuse's price of one later use (``reload``), the agent's bit (a
  prefix set's memo key) and the compiled search's per-agent rows. An agent's entry is
  recomputed when the view shows its prefix changed (a load, an eviction, a copy written to
  host, the radix cache dropping it: its ``(tokens, on_host, cached)``), all of them when the
  cost model or the agent set changes;
* per agent, for the compiled set-up (``topas_setup_compiled``): the in-batch guard's cap
  (``EngineView.admit_cap``) and whether its prefix is resident (R_t, as a bitmask and a set),
  recomputed when the agent's prefix view is a new object (the engine keeps a prefix's view while
  nothing it shows changes).

What is not kept, and why (measured, docs/design.md "Performance"): a decision's other set-up
passes (each task's residual times and Delta_task, the waiting requests' gains and ranking, the
running requests' demand and credit, the pending stages' counts) read quantities that move at
every scheduling point -- tpot with the batch and its KV, g_i(t) with the time, y_r(t) of every
running request -- so a kept copy must be recomputed at nearly every decision, and checking
which parts are still valid costs as much as recomputing them (a per-task cache of the residual
times' parts, hit at 60% of the tasks on DAG-10-Wide, made the set-up no faster).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from topas.engine.view import EngineView, PrefixView, admit_cap

#: Check the kept state against a rebuild at every decision (slow; tests and debugging).
CHECK = os.environ.get("TOPAS_CHECK_STATE", "") not in ("", "0")



def agent_row(pv: PrefixView, move_times: Callable[[int], tuple[float, float]], host_tier: bool,
              engine_moves: bool, recompute: bool) -> tuple[int, float, float, float]:
    """An agent's ``(l_a, move_in, move_out, reload)``: loading its prefix (a swap from host, else
    a prefill), evicting it (a swap to host; free from host), and V_reuse's price of one later use
    (``TopasParams.reuse_cost``: a swap, or with ``engine`` and no host tier a prefill).
    ``engine_moves`` (``TopasParams.move_cost == "engine"``): without a host tier an eviction
    unpins (free) and a still cached prefix is pinned again for free."""
    swap, prefill = move_times(pv.tokens)
    move_in = swap if pv.on_host else prefill
    move_out = 0.0 if pv.on_host else swap
    if engine_moves:
        if pv.cached:
            move_in = 0.0
        if not host_tier:
            move_out = 0.0
    return pv.tokens, move_in, move_out, prefill if recompute else swap


class DecisionState:
    """The set-up state one TOPAS policy keeps across its decisions (see the module docstring).
    The dicts it hands a decision are its own, valid for that decision only."""

    def __init__(self) -> None:
        self._agents_for: Any = None  # (agent order, cost model, host tier) the agent entries hold for
        self._agent_key: dict[str, tuple[int, bool, bool]] = {}
        self.prefix_len: dict[str, int] = {}
        self.move_in: dict[str, float] = {}
        self.move_out: dict[str, float] = {}
        self.reload: dict[str, float] = {}
        self.bit: dict[str, int] = {}
        #: the compiled search's agents: names in bit order, each name's index, the view's
        #: agents' indices, and per agent (in name order) its integer and float rows
        self.names: list[str] = []
        self.idx: dict[str, int] = {}
        self.pref_order: list[int] = []
        self.kernel_ints: list[int] = []  # l_a, the guard's cap (-1: none; set per decision)
        self.kernel_floats: list[float] = []  # move_in, move_out, reload, V_reuse's most (0.0; per decision)
        #: per agent (in name order), the in-batch guard's cap (``EngineView.admit_cap``; -1: none),
        #: and R_t, as a bitmask over the names and as a set, for the compiled set-up
        #: (``topas_setup_compiled``)
        self.caps: list[int] = []
        self.rt_mask = 0
        self.resident: frozenset[str] = frozenset()
        self._pv: dict[str, PrefixView] = {}  # each agent's prefix view its entries hold for

    # ------------------------------------------------------------------ agents
    def agents(self, view: EngineView, move_times: Callable[[int], tuple[float, float]],
               engine_moves: bool, reuse_engine: bool) -> None:
        """Bring the per-agent entries up to ``view`` (``reuse_engine``: ``reuse_cost ==
        "engine"``)."""
        order = tuple(view.prefixes)
        host_tier = view.host_tier
        recompute = reuse_engine and not host_tier
        sharing = view.prefill_prefix_sharing
        key = (order, view.cost, host_tier, engine_moves, recompute, sharing)
        if key != self._agents_for:  # a new agent set or cost model: start afresh
            self._agents_for = key
            self._agent_key = {}
            self.bit = {a: 1 << i for i, a in enumerate(order)}
            self.names = sorted(order)
            self.idx = {a: i for i, a in enumerate(self.names)}
            self.pref_order = [self.idx[a] for a in order]
            self.prefix_len, self.move_in, self.move_out, self.reload = {}, {}, {}, {}
            self.kernel_ints = [0, -1] * len(order)
            self.kernel_floats = [0.0] * (4 * len(order))
            self.caps = [-1] * len(order)
            self.rt_mask = 0
            self.resident = frozenset()
            self._pv = {}
        changed, seen = self._agent_key, self._pv
        rt = self.rt_mask
        for a, pv in view.prefixes.items():
            if seen.get(a) is pv:  # (a prefix's view is kept while it is unchanged)
                continue
            seen[a] = pv
            i = self.idx[a]
            cap = admit_cap(pv.in_tree, pv.computing, not pv.resident and (pv.on_host or pv.cached), sharing)
            self.caps[i] = -1 if cap is None else cap
            rt = rt | (1 << i) if pv.resident else rt & ~(1 << i)
            k = (pv.tokens, pv.on_host, pv.cached)
            if changed.get(a) == k:
                continue
            changed[a] = k
            tokens, mi, mo, rl = agent_row(pv, move_times, host_tier, engine_moves, recompute)
            self.prefix_len[a], self.move_in[a], self.move_out[a], self.reload[a] = tokens, mi, mo, rl
            i = self.idx[a]
            self.kernel_ints[2 * i] = tokens
            self.kernel_floats[4 * i:4 * i + 3] = (mi, mo, rl)
        if rt != self.rt_mask:
            self.rt_mask = rt
            self.resident = frozenset(a for i, a in enumerate(self.names) if (rt >> i) & 1)

    # ------------------------------------------------------------------ the check
    def comparable(self) -> dict[str, Any]:
        """The state's content, for :meth:`check`."""
        return {
            "prefix_len": dict(self.prefix_len), "move_in": dict(self.move_in), "move_out": dict(self.move_out),
            "reload": dict(self.reload), "bit": dict(self.bit), "names": list(self.names), "idx": dict(self.idx),
            "pref_order": list(self.pref_order), "kernel_ints": list(self.kernel_ints),
            "kernel_floats": list(self.kernel_floats), "caps": list(self.caps), "rt_mask": self.rt_mask,
            "resident": self.resident,
        }

    def check(self, fresh: "DecisionState") -> None:
        """Raise AssertionError unless this state equals ``fresh`` (:func:`rebuilt`), entry by
        entry and in the same order (the float sums over the agents run in their dicts' order)."""
        mine, theirs = self.comparable(), fresh.comparable()
        for k in theirs:
            same = mine[k] == theirs[k] and (not isinstance(mine[k], dict) or list(mine[k]) == list(theirs[k]))
            assert same, f"kept state {k!r} differs from a rebuild: {mine[k]} != {theirs[k]}"


def rebuilt(view: EngineView, move_times: Callable[[int], tuple[float, float]], engine_moves: bool,
            reuse_engine: bool) -> DecisionState:
    """The per-agent state computed from ``view`` alone (what :meth:`DecisionState.agents` keeps)."""
    fresh = DecisionState()
    fresh.agents(view, move_times, engine_moves, reuse_engine)
    return fresh


def check_decision(policy: Any, view: EngineView) -> None:
    """Check ``policy``'s kept state, brought up to ``view`` by the decision's set-up, against a
    rebuild from ``view`` alone (``TOPAS_CHECK_STATE=1``; ``tests/test_topas_state.py``)."""
    p = policy.params
    fresh = rebuilt(view, policy.move_times_of(view.cost), p.move_cost == "engine", p.reuse_cost == "engine")
    policy._state.check(fresh)
