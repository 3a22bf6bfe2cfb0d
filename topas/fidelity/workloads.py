"""The fidelity benchmark's workloads: Chain-3 and DAG-4 scaled to the CPU test server.

The shapes are the synthetic ones (``topas.workload.synthetic``); the lengths are chosen for the
CPU server's 4,096-token KV pool and its speed (a decode step of a few ms): the agents' prefixes
take three quarters of the pool, so prefixes and a useful batch do not fit together and the
policies' prefix choices matter (as in the paper's setup, scaled), and each stage decodes
enough tokens (32) that engine time, not the per-request HTTP path, dominates a stage. The
trace files are written to ``data/results/fidelity/traces/`` (``write_traces``), with the
nominal rate ``meta["rate"]`` at which the CPU server is about 60% busy under FCFS.
"""

from __future__ import annotations

from pathlib import Path

from topas.paths import REPO_ROOT
from topas.workload.model import Trace
from topas.workload.synthetic import generate
from topas.workload.trace_io import write_trace

TRACES_DIR = REPO_ROOT / "data" / "results" / "fidelity" / "traces"

#: name -> (synthetic shape, prefix tokens per agent, suffix input tokens, output tokens, nominal rate)
CPU_WORKLOADS: dict[str, tuple[str, int, int, int, float]] = {
    "chain-3-cpu": ("chain-3", 1024, 384, 32, 2.0),
    "dag-4-cpu": ("dag-4", 768, 384, 32, 2.0),
    # the CI case: prefixes take 3/8 of the pool, so at its load prefixes are (almost) never
    # evicted and the cached tokens do not hinge on eviction timing (CPU noise would make a
    # 10% bar on a 12-task run flaky); the timing bar still tests the time model end to end
    "chain-3-ci": ("chain-3", 512, 384, 32, 2.0),
}


def cpu_trace(name: str, n_tasks: int = 40, seed: int = 0) -> Trace:
    shape, prefix, x, y, rate = CPU_WORKLOADS[name]
    t = generate(shape, n_tasks, rate, seed, prefix, x, y)
    meta = dict(t.meta)
    meta["description"] = f"{meta.get('description', shape)} -- scaled to the CPU test server (topas.fidelity.workloads)"
    return Trace(name=name, agents=t.agents, tasks=t.tasks, meta=meta)


def write_traces(out: str | Path = TRACES_DIR, n_tasks: int = 40) -> list[Path]:
    return [write_trace(cpu_trace(n, n_tasks), Path(out) / f"{n}.json.gz") for n in CPU_WORKLOADS]
