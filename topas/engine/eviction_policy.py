"""The ``policy`` eviction strategy: the radix cache evicts in the order of the admission policy's
own per-agent *next-use* values (``Policy.eviction_values``), so that one scheduler decides both
which request goes next and which cached KV goes first.

SGLang 0.5.23 has no such strategy: its closest is ``--radix-eviction-policy priority``
(``mem_cache/evict_policy.py``, ``PriorityStrategy``), where a request's integer ``priority`` is
fixed when it arrives and stays on the nodes it inserted. Here the values are asked afresh before
every eviction pass (an agent's next use changes as its tasks progress), like KVFlow's
``AgentManager`` updating node priorities each step (arXiv 2507.07400; ``topas.engine.eviction_kvflow``
on the branch that models it).

Key of an entry (:class:`topas.engine.eviction.Evictable`): ``(-value(agent), last_access)``: the
entries of the agent needed furthest ahead first (an agent the policy gave no value counts as
never needed: first of all), ties by least recently used, then the engine's
:attr:`Evictable.tie`. Entries are evicted as leaves only (the engine's rule), so an agent's own
suffixes go before its prefix. The engine knows nothing about which policy supplies the values:
any policy overriding ``Policy.eviction_values`` can be run with ``eviction="policy"``; a policy
that does not is refused when the engine starts.
"""

from __future__ import annotations

import math
from typing import Mapping

from topas.engine.eviction import Evictable, EvictionStrategy, register_eviction


@register_eviction
class PolicyEviction(EvictionStrategy):
    """The policy's next-use values, largest (needed latest) first, then least recently used."""

    name = "policy"
    description = "the policy's per-agent next-use values (Policy.eviction_values), latest needed first, then LRU"
    reads_policy = True

    def __init__(self, **kw: int) -> None:
        super().__init__(**kw)
        self._values: Mapping[str, float] = {}

    def take_values(self, values: Mapping[str, float]) -> None:
        bad = [a for a, v in values.items() if not isinstance(v, (int, float)) or math.isnan(v)]
        if bad:
            raise ValueError(f"eviction 'policy': agent {bad[0]!r} has next-use value {values[bad[0]]!r}, "
                             "expected a number (math.inf for never)")
        self._values = values

    def priority(self, e: Evictable) -> tuple:
        return (-self._values.get(e.agent, math.inf), e.last_access)
