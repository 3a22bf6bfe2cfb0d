"""Baselines with the in-batch guard (``<name>-guarded``): the protocol's second set of baselines.

The engine, like SGLang, computes one copy of an agent's prefix per request admitted before the
prefix is in the radix tree. TOPAS and TOPAS+ hold back every request past the first of such an
agent (``topas.engine.view.admit_cap``); stock SGLang guards only its cache-aware policies (LPM's
in-batch check, which deprioritizes rather than holds back). So that no verdict rests on the
baselines lacking the rule, each baseline here also has a guarded variant: its own order, with
the requests past their agent's admit cap held back for a later decision
(``topas.engine.view.within_caps``), the rule TOPAS's plans follow. The engine option
``in_batch_guard`` applies the same rule to any policy (a plugin's too); these names let a sweep
or the protocol run both sets side by side.
"""

from __future__ import annotations

import dataclasses

from topas.engine.view import Decision, EngineView, within_caps
from topas.policies.base import Policy, policy_class, register

#: the baselines that have a guarded variant (``<name>-guarded``)
GUARDED_OF = ("fcfs", "lpm", "spf", "k-lpm")


def _guarded(base: type[Policy]) -> type[Policy]:
    def decide(self: Policy, view: EngineView) -> Decision:
        d = base.decide(self, view)
        if not d.admit:
            return d
        by_id = {r.rid: r for r in view.waiting}
        keep, held = within_caps([by_id[rid] for rid in d.admit], view.admit_cap)
        if not held:
            return d
        admit = tuple(r.rid for r in keep)
        sent = getattr(self, "sent", None)
        if sent is not None:  # a policy that counts what the engine admits of its order (k-LPM)
            sent(admit)
        return dataclasses.replace(d, admit=admit)

    doc = (f"``{base.name}`` with the in-batch guard: its order, less the requests past their agent's admit "
           f"cap (held back until the prefix is cached; ``topas.policies.guarded``).")
    return register(type(f"{base.__name__}Guarded", (base,),
                         {"name": f"{base.name}-guarded", "decide": decide, "__doc__": doc}))


for _name in GUARDED_OF:
    _guarded(policy_class(_name))
