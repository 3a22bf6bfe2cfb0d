"""Checking a policy's :class:`~topas.engine.view.Decision` on the SGLang server against the
simulator's rules (``Simulator.apply``), before the plugin applies it: an infeasible one raises
:class:`~topas.engine.view.InfeasibleDecision` and the adapter falls back to SGLang's own policy
for that step (:meth:`topas.sglang.adapter.Adapter.step`).
"""

from __future__ import annotations

from topas.engine.view import Decision, EngineView, InfeasibleDecision
from topas.policies.base import Policy

__all__ = ["check_decision"]


def check_decision(d: Decision, view: EngineView, policy: Policy) -> None:
    """Raise :class:`InfeasibleDecision` when ``policy``'s decision ``d`` on ``view`` breaks the
    simulator's rules: a policy that does not manage prefixes evicts, loads or (unless it
    ``may_preempt``) preempts; a request admitted twice or not waiting; a preempted request not
    running, or also admitted; an evicted prefix unknown, not resident or in use; a loaded prefix
    unknown, already resident or too large for the free KV tokens; and, for a policy that manages
    prefixes, an admitted request whose prefix is neither resident nor loaded."""
    pname = policy.name
    manages = policy.manages_prefixes
    if not manages and (d.evict or d.load or (d.preempt and not getattr(policy, "may_preempt", False))):
        raise InfeasibleDecision(
            f"policy {pname!r} does not manage prefixes but returned evict/load/preempt")
    waiting = {r.rid: r for r in view.waiting}
    running = {r.rid: r for r in view.running}
    if len(set(d.admit)) != len(d.admit):
        dup = sorted({r for r in d.admit if d.admit.count(r) > 1})
        raise InfeasibleDecision(f"policy {pname!r} admits {dup[0]} twice")
    for rid in d.admit:
        if rid not in waiting:
            raise InfeasibleDecision(f"policy {pname!r} admits {rid}, which is not waiting")
    refs = {a: p.refcount for a, p in view.prefixes.items()}
    for rid in d.preempt:
        if rid not in running:
            raise InfeasibleDecision(f"policy {pname!r} preempts {rid}, which is not running")
        if rid in d.admit:
            raise InfeasibleDecision(f"policy {pname!r} both preempts and admits {rid}")
        refs[running[rid].agent] -= 1
    resident = set(view.resident)
    used = view.prefix_tokens + view.request_tokens - sum(running[r].kv_tokens for r in set(d.preempt))
    for a in d.evict:
        if a not in view.prefixes:
            raise InfeasibleDecision(f"policy {pname!r} names unknown agent prefix {a!r}")
        if a not in resident:
            raise InfeasibleDecision(f"policy {pname!r} evicts prefix {a!r}, which is not resident")
        if refs[a]:
            raise InfeasibleDecision(f"policy {pname!r} evicts prefix {a!r}, used by {refs[a]} running request(s)")
        resident.discard(a)
        used -= view.prefixes[a].tokens
    for a in d.load:
        if a not in view.prefixes:
            raise InfeasibleDecision(f"policy {pname!r} names unknown agent prefix {a!r}")
        if a in resident:
            raise InfeasibleDecision(f"policy {pname!r} loads prefix {a!r}, which is already resident")
        if used + view.prefixes[a].tokens > view.kv_budget:
            raise InfeasibleDecision(
                f"policy {pname!r} loads prefix {a!r} ({view.prefixes[a].tokens} tokens) but only "
                f"{view.kv_budget - used} of {view.kv_budget} KV tokens are free")
        resident.add(a)
        used += view.prefixes[a].tokens
    if manages:
        for rid in d.admit:
            a = waiting[rid].agent
            if a not in resident:
                raise InfeasibleDecision(
                    f"policy {pname!r} admits {rid} but its prefix {a!r} is not resident or loaded")
