"""A held-out family of synthetic workflows: random DAGs with heterogeneous prefixes, fan-in/fan-out
and chain lengths, one mix per generator seed.

The paper's synthetic workloads (:mod:`topas.workload.synthetic`) are three fixed shapes with one
length for every stage, and TOPAS+ and TOPAS's defaults were chosen on them. This family is for
evaluation only: no selection ever sees it (its generator seeds,
``topas.experiments.protocol.seeds.HELD_OUT_WORKFLOW_SEEDS``, are disjoint from every tuning seed).
One seed draws, with ``numpy.random.default_rng([seed, 1])``:

* ``n_agents`` agents (``rdag<seed>.a<k>``), each with a static prefix of ``l_a`` tokens drawn
  log-uniformly from :data:`PREFIX_RANGE` (256-4,096: prefixes of very different sizes compete for
  the KV pool), a nominal suffix input ``x_a`` (:data:`INPUT_RANGE`) and a nominal output ``y_a``
  (:data:`OUTPUT_RANGE`), both log-uniform;
* ``n_workflows`` workflow shapes (``w0``, ``w1``, ...), each a layered DAG: a number of layers
  (the chain length) uniform in :data:`DEPTH_RANGE`, the first layer 1-2 stages wide and every
  other layer uniform in :data:`WIDTH_RANGE` (fan-out); every stage of a layer after the first has
  a uniformly drawn number of parents among the previous layer's stages, chosen at random (fan-in),
  and a stage left without a child gets one in the next layer (no dead ends before the last
  layer). Each stage is served by an agent drawn uniformly from the pool, so agents recur within
  and across workflows (prefix sharing);
* per task: its workflow (uniform), and per stage the input ``x_v = round(x_a * e)`` and output
  ``y_v = round(y_a * e')`` with independent log-normal factors ``e, e'`` of log-sd
  :data:`LENGTH_SIGMA` (clipped to ``[1, 4 x nominal]``): tasks of one workflow differ in length.

An agent's ``expected_output_tokens`` is the mean of its output distribution, ``y_a
exp(sigma^2 / 2)``: a prior an operator would have from history, not the true output of any call.
Arrivals are Poisson (:func:`topas.workload.arrivals.poisson_arrivals` with the same ``seed``) at
the nominal rate, which gives the same offered output-token rate as the paper's synthetic
workloads at theirs (:data:`NOMINAL_OUTPUT_TOKENS_PER_S`: rate x stages x output tokens is 153.6
tokens/s for each of Chain-3, DAG-4 and DAG-10-Wide): ``rate = 153.6 / E[output tokens per
task]``. Experiments re-time the tasks to the loads they sweep, as for every trace. The trace
validates against ``topas.trace/1`` (:func:`topas.workload.validate.validate_trace`) and is written
with :func:`topas.workload.trace_io.write_trace` (data/traces/README.md).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from topas.workload.arrivals import poisson_arrivals
from topas.workload.model import Agent, Stage, Task, Trace
from topas.workload.synthetic import DEFAULTS, SHAPES
from topas.workload.validate import validate_trace

__all__ = [
    "DEFAULT_N_AGENTS",
    "DEFAULT_N_TASKS",
    "DEFAULT_N_WORKFLOWS",
    "DEPTH_RANGE",
    "INPUT_RANGE",
    "LENGTH_SIGMA",
    "NOMINAL_OUTPUT_TOKENS_PER_S",
    "OUTPUT_RANGE",
    "PREFIX_RANGE",
    "WIDTH_RANGE",
    "generate",
    "trace_name",
]

DEFAULT_N_TASKS = 1000
DEFAULT_N_WORKFLOWS = 4
DEFAULT_N_AGENTS = 8
#: Log-uniform ranges (tokens) of an agent's prefix, nominal input and nominal output.
PREFIX_RANGE = (256, 4096)
INPUT_RANGE = (128, 1024)
OUTPUT_RANGE = (64, 512)
#: Uniform ranges of a workflow's number of layers and of a layer's width (after the first).
DEPTH_RANGE = (2, 6)
WIDTH_RANGE = (1, 4)
#: Log-sd of a stage's per-task length factors.
LENGTH_SIGMA = 0.3
#: The paper's synthetic workloads' offered output-token rate at their nominal rates (tokens/s);
#: the same for all three (data/traces/README.md).
NOMINAL_OUTPUT_TOKENS_PER_S = (
    float(DEFAULTS["dag-4"]["rate"]) * len(SHAPES["dag-4"]) * int(DEFAULTS["dag-4"]["output_tokens"])
)


def trace_name(seed: int) -> str:
    """The trace name of generator seed ``seed``: ``random-dag-<seed>``."""
    return f"random-dag-{int(seed)}"


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _shape(rng: np.random.Generator) -> list[tuple[str, tuple[str, ...]]]:
    """One layered DAG: (stage id, parents) in topological order."""
    depth = int(rng.integers(DEPTH_RANGE[0], DEPTH_RANGE[1] + 1))
    widths = [int(rng.integers(1, 3))] + [int(rng.integers(WIDTH_RANGE[0], WIDTH_RANGE[1] + 1))
                                          for _ in range(depth - 1)]
    layers: list[list[str]] = []
    k = 0
    for w in widths:
        layers.append([f"s{k + j:02d}" for j in range(w)])
        k += w
    parents: dict[str, list[str]] = {s: [] for layer in layers for s in layer}
    for prev, layer in zip(layers, layers[1:]):
        for s in layer:
            n = int(rng.integers(1, len(prev) + 1))
            parents[s] = sorted(rng.choice(prev, size=n, replace=False).tolist())
        for p in prev:  # no dead end before the last layer
            if not any(p in parents[s] for s in layer):
                child = layer[int(rng.integers(len(layer)))]
                parents[child] = sorted([*parents[child], p])
    return [(s, tuple(parents[s])) for layer in layers for s in layer]


def _length(rng: np.random.Generator, nominal: int) -> int:
    return int(min(4 * nominal, max(1, round(nominal * math.exp(rng.normal(0.0, LENGTH_SIGMA))))))


def _positive_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"random_dag: {name} must be an integer >= 1, got {v!r}")
    return int(v)


def generate(seed: int, n_tasks: int = DEFAULT_N_TASKS, n_workflows: int = DEFAULT_N_WORKFLOWS,
             n_agents: int = DEFAULT_N_AGENTS, rate: float | None = None) -> Trace:
    """The held-out workflow mix of generator seed ``seed`` (module docstring); ``rate`` ``None``:
    the nominal rate. ``generate(meta["seed"], **meta["params"])`` regenerates a written trace."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"random_dag: seed must be an integer >= 0, got {seed!r}")
    n_tasks = _positive_int("n_tasks", n_tasks)
    n_workflows = _positive_int("n_workflows", n_workflows)
    n_agents = _positive_int("n_agents", n_agents)
    name = trace_name(seed)
    rng = np.random.default_rng([int(seed), 1])
    key = f"rdag{int(seed)}"
    agent_names = [f"{key}.a{k}" for k in range(n_agents)]
    prefix = {a: _log_uniform(rng, *PREFIX_RANGE) for a in agent_names}
    x_nom = {a: _log_uniform(rng, *INPUT_RANGE) for a in agent_names}
    y_nom = {a: _log_uniform(rng, *OUTPUT_RANGE) for a in agent_names}
    shapes = []
    for _ in range(n_workflows):
        shape = _shape(rng)
        shapes.append([(sid, parents, agent_names[int(rng.integers(n_agents))]) for sid, parents in shape])
    mean_factor = math.exp(LENGTH_SIGMA ** 2 / 2)
    agents = {a: Agent(name=a, prefix_tokens=prefix[a], expected_output_tokens=y_nom[a] * mean_factor)
              for a in agent_names}
    out_per_task = sum(sum(y_nom[a] for _s, _p, a in shape) for shape in shapes) / n_workflows * mean_factor
    rate = NOMINAL_OUTPUT_TOKENS_PER_S / out_per_task if rate is None else float(rate)
    arrivals = poisson_arrivals(n_tasks, rate, int(seed))
    tasks = []
    for k, arrival in enumerate(arrivals):
        w = int(rng.integers(n_workflows))
        stages = tuple(Stage(id=sid, agent=a, input_tokens=_length(rng, x_nom[a]), output_tokens=_length(rng, y_nom[a]),
                             parents=parents) for sid, parents, a in shapes[w])
        tasks.append(Task(id=f"t{k:05d}", arrival=arrival, stages=stages, workflow=f"w{w}"))
    meta = {
        "generator": "topas.workload.random_dag.generate",
        "params": {"n_tasks": n_tasks, "n_workflows": n_workflows, "n_agents": n_agents},
        "seed": int(seed),
        "rate": float(rate),
        "arrival_process": "poisson",
        "description": f"held-out random workflows, generator seed {int(seed)}: {n_workflows} layered DAGs "
                       f"over {n_agents} agents with heterogeneous prefixes and lengths",
        "workflows": [{"id": f"w{j}", "stages": len(shape), "depth": _depth(shape)} for j, shape in enumerate(shapes)],
    }
    trace = Trace(name=name, agents=agents, tasks=tuple(tasks), meta=meta)
    validate_trace(trace, source=f"<generated {name}>")
    return trace


def _depth(shape: list[tuple[str, tuple[str, ...], str]]) -> int:
    """Stages on the longest chain of a shape (given in topological order)."""
    level: dict[str, int] = {}
    for sid, parents, _a in shape:
        level[sid] = 1 + max((level[p] for p in parents), default=0)
    return max(level.values())
