"""``prefixplace``: PrefixPlace's per-epoch prefix placement and prefix-following routing (from the issue's summary of the paper).

Source: PrefixPlace (arXiv 2608.01655) as our issue summarises it; the paper's text could not be
read where this was written, so this is "from the issue's summary of the paper" and every
constant, cost formula and tie rule below is ours. The summary: once per epoch, choose each
engine's set of resident prefixes under its budget from profiled demand and recompute/transfer
costs, with a greedy plus a refinement; route requests to an engine holding their prefix; adopt
a new placement only when the predicted saving beats its cost.

Interpretations:

* **Epochs** of ``epoch_s`` simulated seconds from t = 0, closed by the first request routed at
  or after an epoch's end. The first epoch has no placement (no demand is known yet).
* **Demand** (profiled at the router): per agent, the rate of its requests that became ready in
  the closed epoch, smoothed across epochs, ``D_a <- smoothing x rate + (1 - smoothing) x D_a``
  (the first measured epoch sets ``D_a``), and the mean input length ``x_a`` of its requests so
  far. A request's expected duration ``W_{a,e}`` on engine e is Kairos's profile at ``x_a``
  (:func:`~topas.cluster.routers.profile.expected_duration`, decode batch ``ref_batch``).
* **Costs.** ``R_{a,e} = c_e.prefill_time([(l_a, 0)])``: recomputing a's prefix on e (a request
  sent where its prefix is not placed pays it; a new copy costs it once). Moving a prefix between
  engines is priced as that recompute: the simulated engines have no KV link between them, and a
  new copy is what a request on the new engine recomputes.
* **Predicted cost of a placement** (H_a: the engines holding a; requests of a placed agent split
  evenly over H_a, those of an unplaced agent evenly over all N engines, each then paying
  ``R``): engine e carries the request-time rate ``M_e = sum_{a placed on e} D_a/|H_a| x W_{a,e}
  + sum_{a unplaced} D_a/N x (W_{a,e} + R_{a,e})`` and the utilisation ``u_e = M_e / ref_batch``
  (a batch serves ``ref_batch`` requests at once). The placement's cost is
  ``C = sum_e M_e g(u_e)``: the mean number of requests in the cluster by Little's law, with an
  M/M/1-like waiting factor ``g(u) = 1 / (1 - u)`` (ours), continued beyond ``u_max`` along its
  tangent there (so an engine loaded past saturation costs more the more it is loaded, and
  splitting such load still pays; a capped factor would make the cost flat there).
* **Budget.** The prefixes placed on e may use at most ``prefix_fraction x kv_budget_e`` tokens.
* **Greedy.** First one copy of every agent with demand, the most demanded agent first (ties by
  name), on the engine where it gives the lowest ``C`` (ties: the lowest index) among those with
  budget left; then repeatedly the extra copy with the largest decrease of ``C`` per prefix token
  that fits the budget, until none decreases ``C`` (ties: the agent in name order, then the lowest
  engine index). (A first copy alone can cost more than none, since it gathers all of the agent's
  requests on one engine, while several copies cost less: adding copies only while each lowers
  ``C`` would never start.)
* **Refinement.** Up to ``refine_passes`` passes over the copies (agent by name, engine by index):
  drop the copy, move it to another engine, or swap it with another agent's copy on another engine,
  whichever first lowers ``C`` (within budgets); stop early when a pass changes nothing.
* **Adoption.** At each epoch end the new placement replaces the current one only when the
  predicted saving over the next epoch, ``(C(current) - C(new)) x epoch_s`` (both under the new
  demand), exceeds the cost of its new copies, ``switch_weight x sum R_{a,e}`` over copies not in
  the current placement (removing a copy is free).
* **Routing.** A request goes to the engine with the fewest in-flight requests among those its
  agent is placed on (ties to the lowest index), or among all engines if it is placed nowhere. The
  engines' own policies then keep (or not) what they serve: the router steers residency by where
  it sends requests; it cannot pin a prefix itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from topas.cluster.routers.base import Router, RouterError, least_loaded, register
from topas.cluster.routers.profile import expected_duration
from topas.cluster.state import ClusterInfo, EngineState, RouteRequest

#: a placement: agent -> the engines holding a copy of its prefix (agents placed nowhere absent)
Placement = Mapping[str, frozenset[int]]

_EPS = 1e-12


@dataclass(frozen=True)
class PrefixPlaceParams:
    #: epoch length (seconds of simulated time)
    epoch_s: float = 10.0
    #: weight of the newest epoch's rate in the smoothed demand
    smoothing: float = 0.5
    #: share of each engine's KV budget that placed prefixes may use
    prefix_fraction: float = 0.5
    #: the decode batch the duration profile and the utilisation assume
    ref_batch: int = 8
    #: utilisation beyond which the waiting factor 1 / (1 - u) continues along its tangent
    u_max: float = 0.95
    #: refinement passes after the greedy
    refine_passes: int = 2
    #: weight of a new copy's recompute against the predicted saving
    switch_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.epoch_s > 0 or not 0 < self.smoothing <= 1 or not 0 < self.prefix_fraction <= 1:
            raise ValueError("epoch_s must be > 0, smoothing and prefix_fraction in (0, 1]")
        if self.ref_batch < 1 or not 0 < self.u_max < 1 or self.refine_passes < 0 or not self.switch_weight >= 0:
            raise ValueError("ref_batch must be >= 1, u_max in (0, 1), refine_passes >= 0 and switch_weight >= 0")


def waiting_factor(u: float, u_max: float) -> float:
    """``g(u) = 1 / (1 - u)`` up to ``u_max``, then along its tangent there (convex, increasing)."""
    if u <= u_max:
        return 1.0 / (1.0 - u)
    return 1.0 / (1.0 - u_max) + (u - u_max) / (1.0 - u_max) ** 2


@dataclass(frozen=True)
class PlacementProblem:
    """One epoch's placement problem: demand ``D_a`` (requests/s), expected durations ``W[a][e]``
    and recompute costs ``R[a][e]`` (s), prefix lengths, per-engine prefix budgets (tokens)."""

    demand: Mapping[str, float]
    work: Mapping[str, Sequence[float]]
    recompute: Mapping[str, Sequence[float]]
    prefix: Mapping[str, int]
    budget: Sequence[float]
    ref_batch: int
    u_max: float

    @property
    def n(self) -> int:
        return len(self.budget)

    def cost(self, placement: Placement) -> float:
        """``C = sum_e M_e g(M_e / ref_batch)`` (module docstring)."""
        m = [0.0] * self.n
        for a, d in self.demand.items():
            if d <= 0:
                continue
            holders = placement.get(a)
            if holders:
                share = d / len(holders)
                for e in holders:
                    m[e] += share * self.work[a][e]
            else:
                share = d / self.n
                for e in range(self.n):
                    m[e] += share * (self.work[a][e] + self.recompute[a][e])
        return sum(x * waiting_factor(x / self.ref_batch, self.u_max) for x in m)

    def used(self, placement: Placement) -> list[int]:
        """Prefix tokens placed on each engine."""
        u = [0] * self.n
        for a, hs in placement.items():
            for e in hs:
                u[e] += self.prefix[a]
        return u

    def greedy(self) -> dict[str, frozenset[int]]:
        """One copy of each agent with demand (most demand first) where it costs least, then the
        copy with the largest cost decrease per prefix token until none helps."""
        place: dict[str, frozenset[int]] = {}
        used = [0] * self.n
        agents = sorted(a for a, d in self.demand.items() if d > 0)
        for a in sorted(agents, key=lambda a: (-self.demand[a], a)):
            fits = [e for e in range(self.n) if used[e] + self.prefix[a] <= self.budget[e]]
            if fits:
                e = min(fits, key=lambda e: (self.cost({**place, a: frozenset({e})}), e))
                place[a] = frozenset({e})
                used[e] += self.prefix[a]
        cost = self.cost(place)
        while True:
            best: tuple[float, float, str, int] | None = None  # (-gain per token, new cost, agent, engine)
            for a in agents:
                have = place.get(a, frozenset())
                for e in range(self.n):
                    if e in have or used[e] + self.prefix[a] > self.budget[e]:
                        continue
                    c = self.cost({**place, a: have | {e}})
                    gain = cost - c
                    if gain > _EPS:
                        cand = (-gain / max(1, self.prefix[a]), c, a, e)
                        if best is None or cand < best:
                            best = cand
            if best is None:
                return place
            _, cost, a, e = best
            place[a] = place.get(a, frozenset()) | {e}
            used[e] += self.prefix[a]

    def refine(self, placement: Placement, passes: int) -> dict[str, frozenset[int]]:
        """Local search: drop, move or swap copies while one lowers the cost (module docstring)."""
        place = {a: hs for a, hs in placement.items() if hs}
        cost = self.cost(place)
        for _ in range(passes):
            changed = False
            for a, e in [(a, e) for a in sorted(place) for e in sorted(place[a])]:
                if e not in place.get(a, frozenset()):
                    continue  # moved earlier in this pass
                better = next(self._neighbours(place, a, e, cost), None)
                if better is not None:
                    place, cost = better
                    changed = True
            if not changed:
                break
        return place

    def _neighbours(self, place: dict[str, frozenset[int]], a: str, e: int, cost: float):
        """Placements one drop / move / swap of copy (a, e) away that cost less, in the documented order."""
        used = self.used(place)

        def new(p: dict[str, frozenset[int]]):
            p = {k: v for k, v in p.items() if v}
            c = self.cost(p)
            return (p, c) if c < cost - _EPS else None

        def with_(p, agent, remove, add):
            hs = (p.get(agent, frozenset()) - remove) | add
            return {**p, agent: hs}

        if (r := new(with_(place, a, {e}, set()))) is not None:
            yield r
        for f in range(self.n):
            if f != e and f not in place[a] and used[f] + self.prefix[a] <= self.budget[f]:
                if (r := new(with_(place, a, {e}, {f}))) is not None:
                    yield r
        for b in sorted(place):
            if b == a or e in place[b]:
                continue
            for f in sorted(place[b]):
                if f == e or f in place[a]:
                    continue
                if used[e] - self.prefix[a] + self.prefix[b] > self.budget[e] or \
                        used[f] - self.prefix[b] + self.prefix[a] > self.budget[f]:
                    continue
                p = with_(with_(place, a, {e}, {f}), b, {f}, {e})
                if (r := new(p)) is not None:
                    yield r

    def switch_cost(self, current: Placement, new: Placement) -> float:
        """Recompute seconds of the copies in ``new`` that ``current`` does not have."""
        return sum(self.recompute[a][e] for a, hs in new.items() for e in hs - current.get(a, frozenset()))


@register
class PrefixPlace(Router):
    name = "prefixplace"
    Params = PrefixPlaceParams

    def reset(self, n_engines: int, seed: int = 0, info: ClusterInfo | None = None) -> None:
        super().reset(n_engines, seed, info)
        if info is None:
            raise RouterError("router 'prefixplace' needs the agents' profile and the engines' cost models (ClusterInfo)")
        self.epoch_end = self.params.epoch_s
        self.counts: dict[str, int] = {}
        self.demand: dict[str, float] | None = None
        self.input_sum: dict[str, int] = {}
        self.input_n: dict[str, int] = {}
        self.placement: dict[str, frozenset[int]] = {}
        #: one row per plan: (time planned, adopted?, C(current), C(new), switch cost, the
        #: placement in force from then on)
        self.history: list[tuple[float, bool, float, float, float, Placement]] = []

    # ------------------------------------------------------------------ epochs
    def observe(self, request: RouteRequest) -> None:
        a = request.agent
        self.counts[a] = self.counts.get(a, 0) + 1
        self.input_sum[a] = self.input_sum.get(a, 0) + request.input_tokens
        self.input_n[a] = self.input_n.get(a, 0) + 1

    def close_epochs(self, now: float, engines: Sequence[EngineState]) -> None:
        """Close every epoch that ended at or before ``now``: update the demand, then plan once."""
        if now < self.epoch_end:
            return
        p = self.params
        n_closed = int((now - self.epoch_end) // p.epoch_s) + 1
        rate = {a: self.counts.get(a, 0) / p.epoch_s for a in self.info.prefix_tokens}
        if self.demand is None:
            self.demand = rate
        else:
            self.demand = {a: p.smoothing * rate[a] + (1 - p.smoothing) * self.demand.get(a, 0.0) for a in rate}
        if n_closed > 1:  # later epochs saw no request
            keep = (1 - p.smoothing) ** (n_closed - 1)
            self.demand = {a: d * keep for a, d in self.demand.items()}
        self.counts = {}
        self.epoch_end += n_closed * p.epoch_s
        self.plan(engines, now)

    def problem(self, engines: Sequence[EngineState]) -> PlacementProblem:
        p, info = self.params, self.info
        agents = sorted(self.demand)
        xs = {a: round(self.input_sum[a] / self.input_n[a]) if self.input_n.get(a) else 0 for a in agents}
        return PlacementProblem(
            demand=dict(self.demand),
            work={a: [expected_duration(info, a, xs[a], e, p.ref_batch) for e in range(self.n_engines)] for a in agents},
            recompute={a: [info.costs[e].prefill_time([(info.prefix_tokens[a], 0)]) for e in range(self.n_engines)]
                       for a in agents},
            prefix={a: info.prefix_tokens[a] for a in agents},
            budget=[p.prefix_fraction * e.kv_budget for e in engines],
            ref_batch=p.ref_batch, u_max=p.u_max)

    def plan(self, engines: Sequence[EngineState], now: float) -> None:
        """Greedy plus refinement; adopt when the predicted saving beats the switch cost."""
        prob = self.problem(engines)
        new = prob.refine(prob.greedy(), self.params.refine_passes)
        c_old, c_new = prob.cost(self.placement), prob.cost(new)
        switch = self.params.switch_weight * prob.switch_cost(self.placement, new)
        adopt = (c_old - c_new) * self.params.epoch_s > switch
        if adopt:
            self.placement = new
        self.history.append((now, adopt, c_old, c_new, switch, self.placement))

    # ------------------------------------------------------------------ routing
    def route(self, request: RouteRequest, engines: Sequence[EngineState]) -> int:
        self.close_epochs(request.time, engines)
        self.observe(request)
        holders = self.placement.get(request.agent)
        return least_loaded(engines, sorted(holders)) if holders else least_loaded(engines)
