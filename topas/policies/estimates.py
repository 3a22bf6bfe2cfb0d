"""Service-time estimates a real scheduler can make: no true output lengths, no future.

Output lengths: per agent, the empirical distribution ``F_a`` of the outputs of that agent's
*finished* calls (observed online through ``Policy.on_finish``), seeded by the trace-level
prior ``expected_output_tokens`` (what an operator knows from history) as ``prior_weight``
pseudo-observations until real ones arrive. Residuals are conditioned on service already
received: for a call that has generated ``g`` tokens, ``E[Y - g | Y > g]`` over the samples
(the paper: "residual service times ... conditioned on service already received").

Two estimators (the ``output_estimator`` parameter of SPF and TOPAS):

* ``"online"`` (the default, and the only one before issue 16): the rule above. It learns from
  finished requests only; each agent's prior counts as ``prior_weight`` observations, so a wrong
  prior (``--prior-noise``/``--prior-bias``) is outvoted as calls finish: after ``n`` calls the
  mean estimate is ``(prior_weight * prior + sum of outputs) / (prior_weight + n)`` (the last
  ``max_samples`` outputs). :func:`estimator_convergence` shows how fast on a trace;
* ``"prior"``: never learns; every residual is ``max(prior - g, 1)`` (what a scheduler that
  trusts its profile does), so the priors' errors are felt in full.

Times: a stage's expected residual service time in seconds is its prefill (suffix input plus
tokens to recompute, on top of the cached prefix) plus the expected remaining output times the
per-token decode time at the engine's current operating point (batch and KV), from the cost
model. Using the current operating point is our choice (the paper does not say).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

import numpy as np

from topas.engine.knowledge import Knowledge
from topas.engine.view import EngineView, StageView


@dataclass
class OutputEstimator:
    """Per-agent empirical output-length distributions with a prior."""

    prior_weight: int = 1
    max_samples: int = 256  # keep the most recent observations per agent
    learn: bool = True  # False: the "prior" estimator (observe() is a no-op)
    _samples: dict[str, list[int]] = field(default_factory=dict)  # sorted, per agent
    _recent: dict[str, list[int]] = field(default_factory=dict)  # arrival order, per agent
    _suffix: dict[str, list[int]] = field(default_factory=dict)  # suffix sums of _samples
    #: observations so far: a memo of ``expected_remaining`` is valid while this is unchanged
    version: int = 0
    #: per agent, ``version`` at its last observation: a memo of one agent's
    #: ``expected_remaining`` is valid while its entry is unchanged
    agent_version: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.learn:
            self.prior_weight = max(self.prior_weight, 1)  # the prior is all it has

    def observe(self, agent: str, output_tokens: int) -> None:
        if not self.learn:
            return
        self._suffix.pop(agent, None)
        self.version += 1
        self.agent_version[agent] = self.version
        recent = self._recent.setdefault(agent, [])
        recent.append(int(output_tokens))
        if len(recent) > self.max_samples:
            old = recent.pop(0)
            s = self._samples[agent]
            del s[bisect.bisect_left(s, old)]
        bisect.insort(self._samples.setdefault(agent, []), int(output_tokens))

    def _suffix_sum(self, agent: str, k: int) -> int:
        """sum(sorted samples[k:]), from cached suffix sums (rebuilt after each observation)."""
        sums = self._suffix.get(agent)
        if sums is None:  # (integers: any order of additions gives the same sums)
            sums = self._suffix[agent] = list(itertools.accumulate(reversed(self._samples.get(agent, [])), initial=0))
            sums.reverse()
        return sums[k]

    def samples(self, agent: str, prior: float) -> list[float]:
        """The agent's observed outputs (sorted) plus ``prior_weight`` copies of the prior."""
        obs = self._samples.get(agent, [])
        return [float(prior)] * self.prior_weight + [float(v) for v in obs]

    def expected_remaining(self, agent: str, prior: float, generated: int) -> float:
        """``E[Y - g | Y > g]``; if no sample exceeds ``g``, one more token is expected."""
        obs = self._samples.get(agent, [])
        k = bisect.bisect_right(obs, generated)
        total = self._suffix_sum(agent, k) - generated * (len(obs) - k)
        n = len(obs) - k
        if prior > generated:
            total += self.prior_weight * (prior - generated)
            n += self.prior_weight
        return total / n if n else 1.0

    def sample_remaining(self, agent: str, prior: float, generated: int, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` draws of ``Y - g`` from the conditional empirical distribution ``Y | Y > g``."""
        vals = [v - generated for v in self.samples(agent, prior) if v > generated]
        if not vals:
            return np.ones(size)
        return rng.choice(np.asarray(vals, dtype=float), size=size)


class StageParts:
    """The two parts of a stage's residual time, kept by a policy across decisions: the prefill
    of its input and recomputed tokens (``CostModel.prefill_time``, by tokens and prefix length,
    for one cost model) and ``E[Y - g | Y > g]`` (``OutputEstimator.expected_remaining``, by
    agent, prior and ``g``, while the agent's observations are unchanged:
    ``OutputEstimator.agent_version``). A stage's time is then ``prefill + remaining * tpot``, as
    :func:`stage_residual_time` computes it (the same operations, so the same float)."""

    __slots__ = ("cost", "est", "prefills", "remainings")

    def __init__(self) -> None:
        self.cost: object = None
        self.est: object = None
        self.prefills: dict[tuple[int, int], float] = {}
        self.remainings: dict[str, tuple[int, dict[tuple[float, int], float]]] = {}

    def prefill(self, view: EngineView, tokens: int, prefix: int) -> float:
        if view.cost is not self.cost:
            self.cost, self.prefills = view.cost, {}
        v = self.prefills.get((tokens, prefix))
        if v is None:
            v = self.prefills[(tokens, prefix)] = view.cost.prefill_time([(tokens, prefix)])
        return v

    def remaining(self, est: OutputEstimator, agent: str, prior: float, generated: int) -> float:
        if est is not self.est:
            self.est, self.remainings = est, {}
        version = est.agent_version.get(agent, 0)
        kept = self.remainings.get(agent)
        if kept is None or kept[0] != version:
            kept = self.remainings[agent] = (version, {})
        v = kept[1].get((prior, generated))
        if v is None:
            v = kept[1][(prior, generated)] = est.expected_remaining(agent, prior, generated)
        return v


def make_estimator(kind: str, prior_weight: int) -> OutputEstimator:
    """The ``output_estimator`` a policy parameter names: ``"online"`` or ``"prior"``."""
    if kind not in ("online", "prior"):
        raise ValueError(f"output_estimator must be 'online' or 'prior', got {kind!r}")
    return OutputEstimator(prior_weight=prior_weight, learn=kind == "online")


def estimator_convergence(trace, prior_noise: float = 0.0, prior_bias: float = 1.0, seed: int = 0,
                          prior_weight: int = 1, checkpoints=(0, 1, 2, 5, 10, 20, 50, 100, 200)):
    """How fast the ``online`` estimator's mean output of each agent approaches the agent's true
    mean, fed the agent's calls in the order their tasks arrive (a finished-call stream without
    the engine's reordering), from the prior as a policy would see it under ``prior_noise`` and
    ``prior_bias`` (``topas.engine.knowledge``, seeded by ``seed``).

    Returns a DataFrame: ``agent``, ``n`` (calls observed; only checkpoints the agent reaches),
    ``estimate`` (``E[Y]`` of the estimator), ``truth`` (the mean of all the agent's calls in the
    trace), ``rel_error`` = ``|estimate - truth| / truth``.
    """
    import pandas as pd  # lazy: pandas (~0.4 s) for this analysis only; policies also run inside SGLang

    know = Knowledge(prior_noise, prior_bias, "full", seed)
    outputs: dict[str, list[int]] = {a: [] for a in trace.agents}
    for task in trace.tasks:
        for st in task.stages:
            outputs[st.agent].append(st.output_tokens)
    rows = []
    for agent, ys in outputs.items():
        if not ys:
            continue
        truth = float(np.mean(ys))
        prior = know.prior(agent, trace.agents[agent].expected_output_tokens)
        est = OutputEstimator(prior_weight=prior_weight)
        marks = sorted({c for c in checkpoints if c <= len(ys)})
        for n in range(len(ys) + 1):
            if n in marks:
                e = est.expected_remaining(agent, prior, 0)
                rows.append({"agent": agent, "n": n, "estimate": e, "truth": truth,
                             "rel_error": abs(e - truth) / truth if truth > 0 else float("nan")})
            if n < len(ys):
                est.observe(agent, ys[n])
    return pd.DataFrame(rows, columns=["agent", "n", "estimate", "truth", "rel_error"])


@dataclass(frozen=True)
class OperatingPoint:
    """Per-token decode time and the cached-prefix length used for prefill estimates."""

    tpot: float  # seconds per output token at the current batch and KV

    @staticmethod
    def of(view: EngineView) -> "OperatingPoint":
        batch = max(view.decode_batch, 1)
        kv = max(view.request_tokens + view.prefix_tokens, 1)
        return OperatingPoint(tpot=view.cost.decode_time(batch, kv))


def stage_residual_time(
    view: EngineView,
    est: OutputEstimator,
    op: OperatingPoint,
    stage: StageView,
    generated: int = 0,
) -> float:
    """Expected residual service time (s) of a stage that has generated ``generated`` tokens."""
    p = view.prefixes[stage.agent]
    prefill = view.cost.prefill_time([(stage.input_tokens + generated, p.tokens)])
    return prefill + est.expected_remaining(stage.agent, p.expected_output_tokens, generated) * op.tpot
