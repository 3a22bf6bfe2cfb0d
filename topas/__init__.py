"""topas: a reproduction of TOPAS, workflow-aware prefix-state scheduling for multi-agent LLM serving.

The library is small on purpose: ``topas.workload`` (workflows and traces), ``topas.engine``
(cost model, KV memory, the event-driven simulator), ``topas.policies`` (the schedulers),
``topas.experiments`` (experiments, sweeps, the results store).
"""

__version__ = "0.1.0"
