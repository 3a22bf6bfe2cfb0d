"""What a policy is allowed to know: an experiment parameter applied to the policy's view only.

The paper assumes known request profiles and static task DAGs. :class:`Knowledge` degrades both,
*only in what the engine shows the policy* (``EngineView``); the engine itself always runs the
trace's true lengths and DAGs:

* ``prior_noise`` (sigma S >= 0): each agent's expected output length (``PrefixView.
  expected_output_tokens``, the only per-agent or per-request output estimate a view carries) is
  multiplied by a log-normal factor ``exp(S * z_a)``, ``z_a ~ N(0, 1)``: median 1, so the noise
  is unbiased in log space (the mean factor is ``exp(S^2 / 2)``). The factor is fixed per agent
  for the whole run (a wrong prior, not jitter) and is a pure function of ``(seed, agent name)``
  (:func:`noise_factor`), so every process draws the same noisy priors;
* ``prior_bias`` (B > 0): every prior is also multiplied by ``B`` (systematic over- or
  under-estimation);
* ``dag_visibility``: ``"full"`` (today: a task's whole DAG from its arrival) or ``"online"``
  (a task's stages appear only once they are ready; the view keeps the task's workflow name,
  arrival and the agents' priors). :func:`reveal` is the filter, shared by the simulator
  (``TaskState.view``) and the SGLang plugin (``topas.sglang.adapter``).

The defaults (0, 1, "full") are today's behaviour exactly: :meth:`Knowledge.prior` returns the
prior unchanged and the task views are the unfiltered ones.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Collection, Mapping

import numpy as np

from topas.engine.view import StageView

VISIBILITIES = ("full", "online")
#: A fixed tag that separates the prior-noise stream from every other use of the seed.
_NOISE_STREAM = 0x6B6E6F77  # "know"


class KnowledgeError(ValueError):
    """A bad knowledge setting; the message names it."""


@lru_cache(maxsize=4096)
def _standard_normal(seed: int, agent: str) -> float:
    digest = hashlib.sha256(agent.encode("utf-8")).digest()
    agent_word = int.from_bytes(digest[:8], "big")
    return float(np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, _NOISE_STREAM, agent_word]).standard_normal())


def noise_factor(sigma: float, seed: int, agent: str) -> float:
    """The log-normal factor ``exp(sigma * z)`` of ``agent``'s prior; ``z ~ N(0, 1)`` depends
    only on ``(seed, agent)`` (sha256 of the name, not Python's per-process string hash)."""
    if sigma == 0:
        return 1.0
    return math.exp(sigma * _standard_normal(seed, agent))


@dataclass(frozen=True)
class Knowledge:
    """The knowledge settings of one run (see the module docstring)."""

    prior_noise: float = 0.0
    prior_bias: float = 1.0
    dag_visibility: str = "full"
    seed: int = 0

    def __post_init__(self) -> None:
        for name, lo_ok in (("prior_noise", lambda v: v >= 0), ("prior_bias", lambda v: v > 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not lo_ok(v):
                need = ">= 0" if name == "prior_noise" else "> 0"
                raise KnowledgeError(f"{name} must be a finite number {need}, got {name}={v!r}")
            object.__setattr__(self, name, float(v))
        if self.dag_visibility not in VISIBILITIES:
            raise KnowledgeError(
                f"dag_visibility must be one of {', '.join(VISIBILITIES)}, got {self.dag_visibility!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise KnowledgeError(f"knowledge seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))

    @property
    def exact_priors(self) -> bool:
        """True when the priors are shown unchanged (no noise, no bias)."""
        return self.prior_noise == 0.0 and self.prior_bias == 1.0

    @property
    def is_default(self) -> bool:
        """Today's knowledge: exact priors and full DAGs (the seed then does not matter)."""
        return self.exact_priors and self.dag_visibility == "full"

    @property
    def online(self) -> bool:
        return self.dag_visibility == "online"

    def prior(self, agent: str, expected: float) -> float:
        """The expected output length of ``agent`` as the policy sees it."""
        if self.exact_priors:
            return expected
        return float(expected) * self.prior_bias * noise_factor(self.prior_noise, self.seed, agent)

    def settings(self) -> dict[str, Any]:
        """The non-default settings (for keys and request metadata; the seed only with noise)."""
        out: dict[str, Any] = {}
        if self.prior_noise != 0.0:
            out["prior_noise"] = self.prior_noise
            out["seed"] = self.seed
        if self.prior_bias != 1.0:
            out["prior_bias"] = self.prior_bias
        if self.dag_visibility != "full":
            out["dag_visibility"] = self.dag_visibility
        return out

    @classmethod
    def from_settings(cls, d: Mapping[str, Any] | None) -> "Knowledge":
        """The inverse of :meth:`settings` (unknown names raise :class:`KnowledgeError`)."""
        d = dict(d or {})
        unknown = sorted(set(d) - {"prior_noise", "prior_bias", "dag_visibility", "seed"})
        if unknown:
            raise KnowledgeError(f"unknown knowledge setting {unknown[0]!r}; valid: prior_noise, prior_bias, "
                                 "dag_visibility, seed")
        return cls(**d)


def reveal(
    stages: Mapping[str, StageView],
    topo_order: tuple[str, ...],
    revealed: Collection[str],
) -> tuple[dict[str, StageView], tuple[str, ...]]:
    """The part of a DAG a policy sees under ``online`` visibility: the ``revealed`` stages (the
    ready, running and finished ones), each with its children restricted to revealed stages (a
    stage's parents are all finished once it is ready, so they are revealed already)."""
    shown = {s: stages[s] for s in topo_order if s in revealed}
    out: dict[str, StageView] = {}
    for sid, st in shown.items():
        kids = tuple(c for c in st.children if c in shown)
        out[sid] = st if kids == st.children else StageView(st.id, st.agent, st.input_tokens, st.parents, kids)
    return out, tuple(shown)
