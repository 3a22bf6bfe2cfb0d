"""Simulator fidelity: how closely the simulator predicts a real SGLang server on the same traces.

* :mod:`topas.fidelity.compare`: pure comparison logic (per-run metrics, relative errors against
  bars, rank agreement, per-task pairs); no server needed, unit-tested with synthetic results.
* :mod:`topas.fidelity.profile_server`: measure a running server's prefill/decode times through
  its ``/generate`` API and fit the simulator's profile form (``topas.engine.cost``).
* :mod:`topas.fidelity.run`: replay traces on a server (``topas.sglang.replay``), simulate them
  with the server's measured profile and KV budget, and write the comparison.
* :mod:`topas.fidelity.report`: the figure and table of notebook 10.
* :mod:`topas.fidelity.real_router`: a real ``sglang-router``'s choices (read from its workers'
  decision logs) against the simulator's router model (``make test-cluster``).
"""
