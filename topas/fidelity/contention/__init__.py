"""Contention fidelity: agents' prefixes compete for a KV pool that holds about two of them; the
simulator against the real server, request by request.

The JCT suites (:mod:`topas.fidelity.run`) pass on pools where prefixes are rarely evicted; what
the paper is about (which prefixes stay cached when they do not all fit) shows only per request.
Here every measured run is replayed with the server's per-request record (``cached_tokens`` from
``meta_info``; the prefill batch it entered, ``forward_entry_time``; when it finished) and compared
with the simulation of the same trace (calibrated to that run's speed, as in
:func:`topas.fidelity.run.run_fidelity`, which runs the points and writes the JCT comparison):

* **hit/miss**: a request *hits* when the server reports at least its agent's prefix cached
  (SGLang's ``cached_tokens``: prompt tokens found in the radix cache when its prefill was
  scheduled, summed over its admissions); in the simulator, its ``cached_tokens`` column when the
  engine has one, else its ``prefix_hit`` (prefix resident before the decision that admitted it,
  the older definition);
* **admission waves**: requests admitted in the same prefill batch form a wave (the server: one
  ``forward_entry_time``; the simulator: one ``first_admit``); waves are numbered 0, 1, ... in
  time order and compared per request (meaningful for scripted bursts, where arrival noise does
  not move them);
* **completion order**: the fraction of request pairs that finish in the same order in both
  (pairs that the simulator finishes in the same step do not count).

The simulation is timed by the arrivals the server saw (:data:`ARRIVALS`): by default when its
tokenizer manager received each task's first request; ``scheduler`` / ``scheduler-mid`` when that
request entered the scheduler's waiting queue (``server_queued``, recorded by the replay since
issue 12's follow-up) or the middle of its way there. The server's own noise is the same
agreement between its repeats. Cases (:data:`CASES`): scripted
bursts (each agent's requests at t=0, a few ms apart so their order is fixed) and Poisson traces;
cases with a task context shared between calls (``kind="context"``, ``topas.trace/2``
traces, compared on ``cached_tokens`` request by request like the rest; a case may name what the
simulator must model first, ``needs``, and :func:`comparable_cases` leaves such cases out; none
does today); modes (:data:`MODES`): the topas plugin running FCFS, LPM and TOPAS, and stock SGLang (no plugin)
with ``--schedule-policy fcfs`` or ``lpm``, simulated with topas's FCFS and LPM; the eviction
modes (:data:`EVICTION_MODES`, on :data:`EVICTION_CASES`): stock SGLang fcfs with each
``--radix-eviction-policy`` (lru, lfu, slru, priority; priority also with the replay sending each
request's ``priority`` from a rule of :mod:`topas.sglang.priority`), simulated with the same
``EngineConfig.eviction`` and the rule as the policy's ``request_priority``.

Run by ``scripts/fidelity_contention.py`` (``make fidelity-contention``); results under
``data/results/fidelity/contention/``.
"""

from topas.fidelity.contention.cases import (  # noqa: F401
    CASES,
    Case,
    EVICTION_CASES,
    EVICTION_MODES,
    GUARD_CASES,
    GUARD_MODES,
    MODES,
    Mode,
    OUT_DIR,
    POOL,
    all_modes,
    case_trace,
    comparable_cases,
    find_mode,
    write_case_trace,
)
from topas.fidelity.contention.agreement import (  # noqa: F401
    ARRIVALS,
    ARRIVAL_COLUMN,
    admission_waves,
    agreement,
    ingest_window_mid,
    observed_trace,
    order_agreement,
    request_hits,
    request_table,
    run_noise,
)
from topas.fidelity.contention.suite import (  # noqa: F401
    JCT_BAR,
    POISSON_HIT_BAR,
    compare_runs,
    evaluate,
    measure_cases,
    summarize,
)

__all__ = [
    "ARRIVALS",
    "ARRIVAL_COLUMN",
    "CASES",
    "Case",
    "EVICTION_CASES",
    "EVICTION_MODES",
    "GUARD_CASES",
    "GUARD_MODES",
    "JCT_BAR",
    "MODES",
    "Mode",
    "OUT_DIR",
    "POISSON_HIT_BAR",
    "POOL",
    "admission_waves",
    "agreement",
    "all_modes",
    "case_trace",
    "comparable_cases",
    "find_mode",
    "compare_runs",
    "evaluate",
    "ingest_window_mid",
    "measure_cases",
    "observed_trace",
    "order_agreement",
    "request_hits",
    "request_table",
    "run_noise",
    "summarize",
    "write_case_trace",
]
