"""The simulator as a registered engine: ``sim`` (:mod:`topas.engine.registry`).

One GPU running stock SGLang (:func:`topas.engine.simulator.simulate`), its behaviours switched
by the experiment's ``engine_options``; several of it behind a router run as the ``cluster``
engine (:mod:`topas.cluster.sim_engine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topas.engine import simulator
from topas.engine.registry import Engine, PreparedRun, register
from topas.provenance import CODE_PACKAGES

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.metrics import SimResult

__all__ = ["SimEngine"]


class SimEngine(Engine):
    """The event-driven simulator of one SGLang engine."""

    name = "sim"
    label = "the simulator"
    code = CODE_PACKAGES
    options = True
    cluster = "cluster"

    def run(self, prepared: PreparedRun, progress: bool = False) -> "SimResult":
        """Simulate the prepared trace: requests end at EOS as a real model's do, so running
        requests reserve SGLang's decaying ``new_token_ratio`` of their remaining output."""

        p = prepared
        return simulator.simulate(p.trace, p.policy, p.cost, p.config, progress=progress, knowledge=p.knowledge)


register(SimEngine())
