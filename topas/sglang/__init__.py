"""SGLang engine: the scheduler plugin, the launcher and the trace-replay client.

* :mod:`topas.sglang.adapter`: snapshots of SGLang's scheduler in, the policy's EngineView built
  as the simulator builds it, concrete actions out (no SGLang import; tested on its own); what
  it tracks between iterations is :mod:`topas.sglang.adapter_state`, its check of a decision
  :mod:`topas.sglang.decision_check`.
* :mod:`topas.sglang.plugin`: the hooks inside SGLang's scheduler process (entry point
  ``sglang.srt.plugins: topas``).
* :mod:`topas.sglang.replay`: ``run_replay`` and ``topas replay``: a trace against a server,
  results in the simulator's :class:`~topas.engine.metrics.SimResult` format.
* :mod:`topas.sglang.launcher`: ``topas serve``.
* :mod:`topas.sglang.tokens`: deterministic ``input_ids`` (shared agent prefixes).

Nothing here imports ``sglang`` at module level; only the plugin needs it, inside the server.
"""
