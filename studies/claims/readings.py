"""The space of readings: every choice the paper leaves open, as a named axis with alternatives.

TOPAS's paper (and the baselines' papers, and the paper's description of its engine) leave
choices open that move the results (issue 13, docs/method.md "Readings"). Each is an *axis*
here: the policy it belongs to (or ``"engine"``), the parameter it sets, its default (the reading
of the figures so far, so a default run is unchanged), its alternatives and one line on what the
paper leaves open. :func:`one_at_a_time` changes one axis at a time from the defaults;
:func:`factorial` crosses chosen axes. Both return :class:`Variant` rows ``(label, policy,
params, engine_options)`` that :meth:`Variant.experiment` turns into an
:class:`~topas.experiments.spec.Experiment`.

Engine axes set ``engine_options`` (:class:`topas.engine.config.EngineConfig` fields), possibly
per policy: ``host_tier = "topas-only"`` gives the host tier to the TOPAS family (``topas`` and
every ``topas-*`` policy) and not to the baselines, the reading that TOPAS's "prefix movement"
moves prefixes to host memory while the baselines ran on stock SGLang. ``swap_bandwidth``
matters only with a host tier, so its alternatives turn the tier on for every policy (unless a
``host_tier`` axis in the same combination says otherwise, in which case a bandwidth without a
tier is dropped as a duplicate).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

ENGINE = "engine"


def in_topas_family(policy: str) -> bool:
    """``topas`` and its variants (``topas-no-reuse``, ``topas-plus``, ...)."""
    return policy == "topas" or policy.startswith("topas-")


@dataclass(frozen=True)
class Axis:
    """One open choice: ``applies_to`` is a policy name or ``"engine"``; ``param`` the policy
    parameter (or the axis's own name for an engine axis); ``engine`` maps (value, policy) to
    engine options (engine axes only)."""

    name: str
    applies_to: str
    param: str
    default: Any
    alternatives: tuple[Any, ...]
    description: str
    engine: Callable[[Any, str], dict[str, Any]] | None = dataclasses.field(default=None, compare=False)

    @property
    def values(self) -> tuple[Any, ...]:
        """The default first, then the alternatives."""
        return (self.default, *self.alternatives)

    def check(self, value: Any) -> None:
        if value not in self.values:
            raise ValueError(f"reading axis {self.name!r} has no value {value!r}; valid values: "
                             + ", ".join(map(repr, self.values)))

    def applies(self, policy: str) -> bool:
        return self.applies_to == ENGINE or self.applies_to == policy

    def params(self, value: Any) -> dict[str, Any]:
        """The policy parameters this axis sets for ``value`` (none for an engine axis or the
        default, so a default run's parameters stay empty)."""
        self.check(value)
        return {} if self.applies_to == ENGINE or value == self.default else {self.param: value}

    def engine_options(self, value: Any, policy: str) -> dict[str, Any]:
        self.check(value)
        return self.engine(value, policy) if self.engine is not None else {}


def _host_tier(value: str, policy: str) -> dict[str, Any]:
    on = value == "all" or (value == "topas-only" and in_topas_family(policy))
    return {"host_tier": True} if on else {}


def _swap_bandwidth(value: float, policy: str) -> dict[str, Any]:
    return {} if value == 1.0 else {"host_tier": True, "swap_bandwidth_scale": float(value)}


def _axes() -> tuple[Axis, ...]:
    T = "topas"
    return (
        # ---- TOPAS
        Axis("search", T, "search", "local", ("local+", "exhaustive"),
             "the paper enumerates subsets up to M agents and does not say how it searches larger pools"),
        Axis("aging_form", T, "aging_form", "log", ("linear",),
             "the form of g_i(t) (log as the summaries give it; strength and growth are not published)"),
        Axis("rho", T, "rho", 0.5, (1.0, 2.0), "the aging strength rho: its value is in the unpublished supplement"),
        Axis("admit_norm", T, "admit_norm", "absolute", ("remaining", "fraction"),
             "whether J_admit counts seconds of critical path or the fraction of the task's remaining path"),
        Axis("sibling_share", T, "sibling_share", "residual", ("equal", "last"),
             "how sequential conditioning splits Delta_task among parallel siblings of one frontier"),
        Axis("redo", T, "redo", "decode", ("reprefill",),
             "J_redo = T_decode * y_r (the paper) although an engine rebuilds y_r tokens with a prefill and a re-wait"),
        Axis("move_cost", T, "move_cost", "swap", ("engine",),
             "J_move prices an eviction as a swap even on an engine that has no host tier"),
        Axis("revalue_credit", T, "revalue_credit", True, (False,),
             "whether lambda_r is frozen at admission (the paper) or ages with its task"),
        Axis("beta", T, "beta", 4.0, (0.0, 1.0), "the weight of V_reuse: its value is in the unpublished supplement"),
        # ---- baselines
        Axis("parrot_grouping", "parrot-fcfs", "group_prefixes", True, (False,),
             "whether the paper's Parrot-FCFS pulls every waiting request of a shared prefix forward"),
        Axis("autellix_preempt", "autellix-las", "preempt", False, (True,),
             "whether the paper's Autellix-LAS preempted demoted calls, as Autellix does"),
        # ---- engine
        Axis("host_tier", ENGINE, "host_tier", "none", ("all", "topas-only"),
             "whether the paper's engine had a host KV tier, and for which policies (TOPAS's 'prefix movement')",
             engine=_host_tier),
        Axis("swap_bandwidth", ENGINE, "swap_bandwidth_scale", 1.0, (0.5, 2.0),
             "the host<->GPU bandwidth B_swap behind J_move and V_reuse (with a host tier for every policy)",
             engine=_swap_bandwidth),
    )


#: name -> :class:`Axis`
READINGS: Mapping[str, Axis] = {a.name: a for a in _axes()}


class Variant(NamedTuple):
    """One run configuration: ``label`` names the non-default readings (``"default"`` if none)."""

    label: str
    policy: str
    params: dict[str, Any]
    engine_options: dict[str, Any]

    def experiment(self, workload: str, **kw: Any):
        """The :class:`~topas.experiments.spec.Experiment` of this variant on ``workload``
        (``load``, ``seed``, ``n_tasks``, ... as keywords)."""
        from topas.experiments.spec import Experiment

        return Experiment(workload, self.policy, self.params, engine_options=self.engine_options, **kw)


def axis(name: str) -> Axis:
    """The axis ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    try:
        return READINGS[name]
    except KeyError:
        raise ValueError(f"unknown reading axis {name!r}; valid axes: {', '.join(READINGS)}") from None


def _check_names(names: Iterable[str]) -> list[Axis]:
    out = [axis(n) for n in names]
    dup = sorted({a.name for a in out if sum(b.name == a.name for b in out) > 1})
    if dup:
        raise ValueError(f"reading axis {dup[0]!r} given twice")
    return out


def variant(policy: str, choices: Mapping[str, Any]) -> Variant:
    """The variant of ``policy`` with the readings ``choices`` (axis name -> value). The label
    names every non-default choice, in :data:`READINGS` order, also those that change nothing for
    this policy (an axis of another policy, a bandwidth without a host tier), so that the runs of
    one combination share a label across policies. Unknown axes or values raise ``ValueError``
    naming them."""
    params: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    label = []
    chosen = _check_names(choices)
    # engine axes other than host_tier first, so that an explicit host_tier has the last word
    for ax in sorted(chosen, key=lambda a: a.name == "host_tier"):
        value = choices[ax.name]
        ax.check(value)
        if value != ax.default:
            label.append(f"{ax.name}={value}")
        if not ax.applies(policy):
            continue
        params.update(ax.params(value))
        if ax.name == "host_tier":
            opts.pop("host_tier", None)
        opts.update(ax.engine_options(value, policy))
    if not opts.get("host_tier"):
        opts.pop("swap_bandwidth_scale", None)  # no host tier: nothing is swapped
    label.sort(key=lambda x: list(READINGS).index(x.split("=", 1)[0]))
    return Variant(",".join(label) or "default", policy, params, opts)


def one_at_a_time(policies: Sequence[str], axes: Sequence[str] | None = None) -> list[Variant]:
    """For each policy: its default, then one variant per alternative of each axis (of ``axes``,
    default all) that applies to it, every other axis at its default. To compare policies under
    one reading, pair each variant with the other policies' variant of the same label, or their
    ``"default"`` where they have none (the axis is not theirs)."""
    chosen = _check_names(READINGS if axes is None else axes)
    out: list[Variant] = []
    for pol in policies:
        out.append(variant(pol, {}))
        for ax in chosen:
            if ax.applies(pol):
                out.extend(variant(pol, {ax.name: v}) for v in ax.alternatives)
    return _unique(out)


def factorial(axes: Sequence[str], policies: Sequence[str] = ("topas",)) -> list[Variant]:
    """For each policy, every combination of the values (default and alternatives) of ``axes``
    that apply to it, labelled with the whole combination (:func:`variant`)."""
    chosen = _check_names(axes)
    out: list[Variant] = []
    for pol in policies:
        for combo in itertools.product(*(a.values for a in chosen)):
            out.append(variant(pol, {a.name: v for a, v in zip(chosen, combo)}))
    return _unique(out)


def _unique(variants: list[Variant]) -> list[Variant]:
    """Each (policy, label) once. Two labels may give one policy the same run (``host_tier=all``
    and ``topas-only`` for TOPAS): both are kept, since they pair it with different baseline runs
    (a result store runs the experiment once)."""
    seen: set[tuple] = set()
    out = []
    for v in variants:
        key = (v.policy, v.label)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out
