"""Latency claims: paired comparisons over common random numbers, only where every policy is stable.

docs/protocol.md "Latency". Each evaluation seed gives every policy the same arrivals (common
random numbers: the arrival seed of :class:`topas.experiments.Experiment`), so two policies are
compared seed by seed: ``d_s = m_s(policy) - m_s(baseline)`` (and ``r_s = m_s(policy) /
m_s(baseline) - 1``) for a metric ``m`` such as the mean JCT. Then

* :func:`paired_t`: the mean of ``d_s`` with its t interval (``scipy.stats.t``, ``n - 1`` degrees
  of freedom; 95% by default), likewise for ``r_s``: for metrics whose per-seed differences are
  roughly symmetric (the mean JCT);
* :func:`paired_bootstrap`: the same means with BCa bootstrap intervals
  (``scipy.stats.bootstrap``, 9,999 resamples, a fixed generator seed): for skewed metrics such
  as the p99 JCT;
* the verdict (:func:`verdict`), lower being better: ``win`` when the whole interval of ``d`` is
  below zero, ``loss`` when it is above, ``tie`` when it holds zero.

Latency is compared only at loads where every compared policy is stable by the steady-state
test: :func:`require_stable` refuses otherwise, naming the policy, the workload and the load;
:func:`compare_latency` checks that first.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy import stats

__all__ = [
    "CONFIDENCE",
    "N_RESAMPLES",
    "BOOTSTRAP_SEED",
    "PairedComparison",
    "UnstableComparison",
    "compare_latency",
    "paired_bootstrap",
    "paired_t",
    "require_stable",
    "verdict",
]

#: Confidence level of every interval.
CONFIDENCE = 0.95
#: Bootstrap resamples, and the seed of the bootstrap's generator (a fixed seed: the same data
#: always give the same interval).
N_RESAMPLES = 9999
BOOTSTRAP_SEED = 0


class UnstableComparison(ValueError):
    """A latency comparison asked for at a load where some compared policy is not stable."""


@dataclass(frozen=True)
class PairedComparison:
    """``policy`` against ``baseline`` on ``metric`` over the seeds both ran (module docstring)."""

    metric: str
    policy: str
    baseline: str
    seeds: tuple[int, ...]
    #: mean of the per-seed differences policy - baseline, and its interval
    difference: float
    low: float
    high: float
    #: mean of the per-seed relative differences policy / baseline - 1, and its interval
    relative: float
    relative_low: float
    relative_high: float
    confidence: float
    #: "t" or "bootstrap-BCa"
    method: str
    #: "win", "tie" or "loss" (lower is better)
    verdict: str

    @property
    def n(self) -> int:
        return len(self.seeds)


def verdict(low: float, high: float, lower_is_better: bool = True) -> str:
    """``win`` / ``loss`` when the interval [low, high] of policy - baseline excludes zero, else ``tie``."""
    if math.isnan(low) or math.isnan(high):
        raise ValueError(f"verdict: the interval [{low}, {high}] is not a number")
    if high < 0:
        return "win" if lower_is_better else "loss"
    if low > 0:
        return "loss" if lower_is_better else "win"
    return "tie"


def _pairs(policy_values: Mapping[int, float], baseline_values: Mapping[int, float], policy: str,
           baseline: str) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    a, b = set(policy_values), set(baseline_values)
    if a != b:
        only_a, only_b = sorted(a - b), sorted(b - a)
        parts = [f"{policy} only: {only_a}" if only_a else "", f"{baseline} only: {only_b}" if only_b else ""]
        raise ValueError(f"paired comparison {policy} vs {baseline}: the seeds differ "
                         f"({'; '.join(p for p in parts if p)}); common random numbers need the same seeds")
    seeds = tuple(sorted(a))
    if len(seeds) < 2:
        raise ValueError(f"paired comparison {policy} vs {baseline}: {len(seeds)} seed(s); an interval needs >= 2")
    x = np.array([float(policy_values[s]) for s in seeds])
    y = np.array([float(baseline_values[s]) for s in seeds])
    for name, v in ((policy, x), (baseline, y)):
        if not np.all(np.isfinite(v)):
            s = seeds[int(np.flatnonzero(~np.isfinite(v))[0])]
            raise ValueError(f"paired comparison: {name}'s value on seed {s} is not finite")
    if np.any(y == 0):
        s = seeds[int(np.flatnonzero(y == 0)[0])]
        raise ValueError(f"paired comparison: {baseline}'s value on seed {s} is 0; no relative difference")
    return seeds, x, y


def _t_interval(d: np.ndarray, confidence: float) -> tuple[float, float, float]:
    mean = float(d.mean())
    sem = float(stats.sem(d))
    if sem == 0.0:  # every seed gives the same difference: the interval is that point
        return mean, mean, mean
    low, high = stats.t.interval(confidence, len(d) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def paired_t(policy_values: Mapping[int, float], baseline_values: Mapping[int, float], metric: str = "jct_mean",
             policy: str = "policy", baseline: str = "baseline", confidence: float = CONFIDENCE,
             lower_is_better: bool = True) -> PairedComparison:
    """Paired t intervals of the per-seed differences (``seed -> value`` for each policy)."""
    seeds, x, y = _pairs(policy_values, baseline_values, policy, baseline)
    d, lo, hi = _t_interval(x - y, confidence)
    r, rlo, rhi = _t_interval(x / y - 1.0, confidence)
    return PairedComparison(metric, policy, baseline, seeds, d, lo, hi, r, rlo, rhi, float(confidence), "t",
                            verdict(lo, hi, lower_is_better))


def _bootstrap_kwargs(seed: int) -> dict:
    """The generator argument of ``scipy.stats.bootstrap``: ``rng`` (SciPy >= 1.15) or ``random_state``."""
    if "rng" in inspect.signature(stats.bootstrap).parameters:
        return {"rng": np.random.default_rng(seed)}
    return {"random_state": np.random.default_rng(seed)}  # pragma: no cover - SciPy < 1.15


def _bootstrap_interval(v: np.ndarray, confidence: float, n_resamples: int, seed: int,
                        statistic: Callable[..., Any]) -> tuple[float, float, float]:
    """``statistic``'s BCa interval over ``v``; ``statistic`` takes an ``axis`` (as ``np.mean`` does)
    so SciPy evaluates all resamples in one call (``vectorized=True``): the resamples are the same
    draws, and each row's mean is summed in the same order as a one-resample call, so the interval
    is the same to the bit (tests/test_paired.py), about 70x faster."""
    est = float(statistic(v))
    if np.ptp(v) == 0.0:  # every resample is the same: the interval is that point (BCa is undefined)
        return est, est, est
    res = stats.bootstrap((v,), statistic, n_resamples=n_resamples, confidence_level=confidence,
                          method="BCa", vectorized=True, **_bootstrap_kwargs(seed))
    ci = res.confidence_interval
    return est, float(ci.low), float(ci.high)


def paired_bootstrap(policy_values: Mapping[int, float], baseline_values: Mapping[int, float],
                     metric: str = "jct_p99", policy: str = "policy", baseline: str = "baseline",
                     confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                     lower_is_better: bool = True) -> PairedComparison:
    """BCa bootstrap intervals of the mean per-seed difference (for skewed metrics such as p99)."""
    seeds, x, y = _pairs(policy_values, baseline_values, policy, baseline)
    d, lo, hi = _bootstrap_interval(x - y, confidence, n_resamples, seed, np.mean)
    r, rlo, rhi = _bootstrap_interval(x / y - 1.0, confidence, n_resamples, seed, np.mean)
    return PairedComparison(metric, policy, baseline, seeds, d, lo, hi, r, rlo, rhi, float(confidence),
                            "bootstrap-BCa", verdict(lo, hi, lower_is_better))


def require_stable(stable: Mapping[str, bool], policies: Sequence[str], load: float, workload: str = "") -> None:
    """Raise :class:`UnstableComparison` naming every compared policy that is not stable (or has no
    verdict) at ``load``: latency is compared only where all of them are."""
    where = f"{workload} at load {load:g}" if workload else f"load {load:g}"
    missing = [p for p in policies if p not in stable]
    if missing:
        raise UnstableComparison(f"no stability verdict for {', '.join(missing)} on {where}; "
                                 "test the runs first (steady_state)")
    bad = [p for p in policies if not stable[p]]
    if bad:
        raise UnstableComparison(f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not stable on {where}: "
                                 "latency is compared only where every compared policy is stable "
                                 "(report capacity or overload there instead)")


def compare_latency(values: Mapping[str, Mapping[int, float]], policy: str, baseline: str,
                    stable: Mapping[str, bool], load: float, workload: str = "", metric: str = "jct_mean",
                    method: str | None = None, confidence: float = CONFIDENCE) -> PairedComparison:
    """``policy`` vs ``baseline`` on ``metric`` (``values[policy][seed]``) at one load, refused unless
    both are stable there. ``method``: ``"t"`` or ``"bootstrap"``; ``None`` picks the bootstrap for a
    tail metric (a name containing ``p9``, e.g. ``jct_p99``) and t otherwise."""
    require_stable(stable, (policy, baseline), load, workload)
    for p in (policy, baseline):
        if p not in values:
            raise ValueError(f"compare_latency: no {metric} values for {p} on {workload or 'the workload'} "
                             f"at load {load:g}")
    if method is None:
        method = "bootstrap" if "p9" in metric else "t"
    if method == "t":
        return paired_t(values[policy], values[baseline], metric, policy, baseline, confidence)
    if method == "bootstrap":
        return paired_bootstrap(values[policy], values[baseline], metric, policy, baseline, confidence)
    raise ValueError(f"compare_latency: method must be 't' or 'bootstrap', got {method!r}")
