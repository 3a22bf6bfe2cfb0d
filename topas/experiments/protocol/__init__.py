"""The experimental protocol behind every headline number (docs/protocol.md), implemented once.

* :mod:`.seeds` -- fixed, disjoint seed ranges for tuning, evaluation and the held-out workflows;
* :mod:`.warmup` -- warm-up removal by MSER-5;
* :mod:`.steady` -- the steady-state test over seeds (does the queue keep growing?);
* :mod:`.grid_capacity` -- capacity from a load grid with an interval, not assuming monotone
  stability;
* :mod:`.paired` -- paired latency comparisons over common random numbers (t and bootstrap
  intervals, win / tie / loss), refused where a compared policy is not stable;
* :mod:`.convergence` -- the convergence study (verdict vs run length) and the capacity table
  built from it.

Statistics come from ``scipy.stats``; these functions are small wrappers with tests against
known cases (tests/test_protocol.py).
"""

from topas.experiments.protocol.convergence import capacity_table, convergence_study
from topas.experiments.protocol.grid_capacity import (
    GridCapacity,
    capacity_from_runs,
    grid_capacity,
    seed_capacity,
)
from topas.experiments.protocol.paired import (
    PairedComparison,
    UnstableComparison,
    compare_latency,
    paired_bootstrap,
    paired_t,
    require_stable,
    verdict,
)
from topas.experiments.protocol.seeds import (
    EVALUATION_SEEDS,
    HELD_OUT_WORKFLOW_SEEDS,
    SEED_RANGES,
    TUNING_SEEDS,
    check_disjoint,
)
from topas.experiments.protocol.steady import GrowthTest, SteadyState, growth_test, steady_state
from topas.experiments.protocol.warmup import Warmup, mser, mser5

__all__ = [
    "EVALUATION_SEEDS",
    "HELD_OUT_WORKFLOW_SEEDS",
    "SEED_RANGES",
    "TUNING_SEEDS",
    "GridCapacity",
    "GrowthTest",
    "PairedComparison",
    "SteadyState",
    "UnstableComparison",
    "Warmup",
    "capacity_from_runs",
    "capacity_table",
    "check_disjoint",
    "compare_latency",
    "convergence_study",
    "grid_capacity",
    "growth_test",
    "mser",
    "mser5",
    "paired_bootstrap",
    "paired_t",
    "require_stable",
    "seed_capacity",
    "steady_state",
    "verdict",
]
