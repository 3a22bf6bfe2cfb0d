"""The paper's synthetic workloads: Chain-3, DAG-4 and DAG-10-Wide, fixed-length queries and outputs.

docs/method.md "Setup and metrics": synthetic DAGs with fixed-length queries and outputs. The shapes:

- ``chain-3``:      A -> B -> C
- ``dag-4``:        A -> {B, C} -> D
- ``dag-10-wide``:  A -> {B, C, D, E, F, G, H, I} -> J   (8 parallel stages)

Each stage uses its own agent, named ``<workload key>.<stage>`` (``chain3.A``, ``dag4.D``,
``dag10wide.J``). Every task of a workload has the same DAG and the same lengths; only the
arrival times differ (Poisson, :mod:`topas.workload.arrivals`). An agent's
``expected_output_tokens`` is its stage's nominal output length: a *prior* that a scheduler may
use (what an operator knows from history), never read by the engine as the truth. With fixed
lengths the prior happens to equal the true output, as it would for any predictor on this
workload.

Default lengths (integers; the paper does not publish its values) are chosen so that the
prefix-vs-batch trade-off bites under the default profile's KV budget (``kv_budget_tokens`` of
``data/profiles/a100-80gb_qwen2.5-32b.json``: 18,358 tokens): all of a workload's prefixes plus a
useful batch (16 requests of ``x + y = 768`` tokens) do not fit at once, while one prefix plus such
a batch does; DAG-10-Wide's ten prefixes do not fit at all. The arithmetic is in data/traces/README.md; ``DEFAULTS`` holds the values.
The default ``rate`` is a nominal rate for the committed files only: experiments re-time the tasks
(:func:`topas.workload.arrivals.retime`) to the rates they sweep.
"""

from __future__ import annotations

import numbers
from typing import Callable, Mapping, Sequence, Union

from topas.workload.arrivals import poisson_arrivals
from topas.workload.model import Agent, Stage, Task, Trace
from topas.workload.validate import validate_trace

#: One length for every stage, or a length per stage id.
Lengths = Union[int, Mapping[str, int]]

#: Stage shapes: (stage id, parents) in declaration (= topological) order.
SHAPES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "chain-3": (("A", ()), ("B", ("A",)), ("C", ("B",))),
    "dag-4": (("A", ()), ("B", ("A",)), ("C", ("A",)), ("D", ("B", "C"))),
    "dag-10-wide": (
        ("A", ()),
        *((s, ("A",)) for s in "BCDEFGHI"),
        ("J", tuple("BCDEFGHI")),
    ),
    "chain-2": (("A", ()), ("B", ("A",))),
}

#: Agent-name prefix of each workload.
AGENT_PREFIX = {"chain-3": "chain3", "dag-4": "dag4", "dag-10-wide": "dag10wide", "chain-2": "chain2"}

#: Default generator parameters per workload (lengths in tokens, rate in tasks/s).
DEFAULTS: dict[str, dict[str, float | int]] = {
    "chain-3": {"prefix_tokens": 4096, "input_tokens": 512, "output_tokens": 256, "rate": 0.2},
    "dag-4": {"prefix_tokens": 3072, "input_tokens": 512, "output_tokens": 256, "rate": 0.15},
    "dag-10-wide": {"prefix_tokens": 2048, "input_tokens": 512, "output_tokens": 256, "rate": 0.06},
    # the mechanism case (MECHANISM): two prefixes of 6,144 tokens leave room for about seven
    # requests beside them; one prefix leaves room for fifteen
    "chain-2": {"prefix_tokens": 6144, "input_tokens": 512, "output_tokens": 256, "rate": 0.3},
}

DEFAULT_N_TASKS = 1000
DEFAULT_SEED = 0

DESCRIPTIONS = {
    "chain-3": "Chain-3: A -> B -> C, one agent per stage, fixed-length queries and outputs",
    "dag-4": "DAG-4: A -> {B, C} -> D, one agent per stage, fixed-length queries and outputs",
    "dag-10-wide": "DAG-10-Wide: A -> {B..I, 8 parallel stages} -> J, one agent per stage, "
    "fixed-length queries and outputs",
    "chain-2": "Chain-2 (the mechanism case, not the paper's): A -> B, one agent per stage, prefixes so long "
    "that both beside a useful batch do not fit the KV budget",
}


def _per_stage(name: str, what: str, value: Lengths, stage_ids: Sequence[str]) -> tuple[dict[str, int], object]:
    """Resolve ``value`` to a length per stage; also return its canonical form for ``meta.params``."""
    if isinstance(value, Mapping):
        keys = sorted(str(k) for k in value)
        if keys != sorted(stage_ids):
            raise ValueError(
                f"{name}: {what} per stage must give exactly the stages {', '.join(stage_ids)}; got {', '.join(keys)}"
            )
        per = {sid: value[sid] for sid in stage_ids}
        canon: object = {k: value[k] for k in keys}
    else:
        per = {sid: value for sid in stage_ids}
        canon = value
    for sid, v in per.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
            raise ValueError(f"{name}: {what} of stage {sid} must be a positive integer, got {v!r}")
    per = {k: int(v) for k, v in per.items()}
    canon = {k: int(v) for k, v in canon.items()} if isinstance(canon, dict) else int(canon)  # type: ignore[arg-type]
    return per, canon


def generate(
    name: str,
    n_tasks: int = DEFAULT_N_TASKS,
    rate: float | None = None,
    seed: int = DEFAULT_SEED,
    prefix_tokens: Lengths | None = None,
    input_tokens: Lengths | None = None,
    output_tokens: Lengths | None = None,
) -> Trace:
    """A synthetic workload ``name`` (a key of :data:`SHAPES`); ``None`` means the default."""
    if name not in SHAPES:
        raise ValueError(f"unknown synthetic workload {name!r} (known: {', '.join(sorted(SHAPES))})")
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, numbers.Integral) or n_tasks < 1:
        raise ValueError(f"{name}: n_tasks must be an integer >= 1, got {n_tasks!r}")
    d = DEFAULTS[name]
    rate = float(d["rate"]) if rate is None else rate
    shape = SHAPES[name]
    ids = [sid for sid, _p in shape]
    prefix, prefix_c = _per_stage(name, "prefix_tokens", d["prefix_tokens"] if prefix_tokens is None else prefix_tokens, ids)  # type: ignore[arg-type]
    x, x_c = _per_stage(name, "input_tokens", d["input_tokens"] if input_tokens is None else input_tokens, ids)  # type: ignore[arg-type]
    y, y_c = _per_stage(name, "output_tokens", d["output_tokens"] if output_tokens is None else output_tokens, ids)  # type: ignore[arg-type]
    key = AGENT_PREFIX[name]
    agent_of = {sid: f"{key}.{sid}" for sid in ids}
    agents = {
        agent_of[sid]: Agent(name=agent_of[sid], prefix_tokens=prefix[sid], expected_output_tokens=float(y[sid]))
        for sid in ids
    }
    stages = tuple(
        Stage(id=sid, agent=agent_of[sid], input_tokens=x[sid], output_tokens=y[sid], parents=tuple(parents))
        for sid, parents in shape
    )
    arrivals = poisson_arrivals(int(n_tasks), rate, seed)
    tasks = tuple(Task(id=f"t{k:05d}", arrival=a, stages=stages, workflow=name) for k, a in enumerate(arrivals))
    meta = {
        "generator": f"topas.workload.synthetic.{key}",
        "params": {"n_tasks": int(n_tasks), "prefix_tokens": prefix_c, "input_tokens": x_c, "output_tokens": y_c},
        "seed": int(seed),
        "rate": float(rate),
        "arrival_process": "poisson",
        "description": DESCRIPTIONS[name],
    }
    trace = Trace(name=name, agents=agents, tasks=tasks, meta=meta)
    validate_trace(trace, source=f"<generated {name}>")
    return trace


def chain3(
    n_tasks: int = DEFAULT_N_TASKS,
    rate: float | None = None,
    seed: int = DEFAULT_SEED,
    prefix_tokens: Lengths | None = None,
    input_tokens: Lengths | None = None,
    output_tokens: Lengths | None = None,
) -> Trace:
    """Chain-3: A -> B -> C. Defaults: prefix 4096, input 512, output 256 tokens; 0.2 tasks/s."""
    return generate("chain-3", n_tasks, rate, seed, prefix_tokens, input_tokens, output_tokens)


def dag4(
    n_tasks: int = DEFAULT_N_TASKS,
    rate: float | None = None,
    seed: int = DEFAULT_SEED,
    prefix_tokens: Lengths | None = None,
    input_tokens: Lengths | None = None,
    output_tokens: Lengths | None = None,
) -> Trace:
    """DAG-4: A -> {B, C} -> D. Defaults: prefix 3072, input 512, output 256 tokens; 0.15 tasks/s."""
    return generate("dag-4", n_tasks, rate, seed, prefix_tokens, input_tokens, output_tokens)


def dag10_wide(
    n_tasks: int = DEFAULT_N_TASKS,
    rate: float | None = None,
    seed: int = DEFAULT_SEED,
    prefix_tokens: Lengths | None = None,
    input_tokens: Lengths | None = None,
    output_tokens: Lengths | None = None,
) -> Trace:
    """DAG-10-Wide: A -> {B..I} -> J. Defaults: prefix 2048, input 512, output 256 tokens; 0.06 tasks/s."""
    return generate("dag-10-wide", n_tasks, rate, seed, prefix_tokens, input_tokens, output_tokens)


#: Workload name -> generator. ``SYNTHETIC[name](**meta["params"], rate=meta["rate"],
#: seed=meta["seed"])`` regenerates a committed trace.
SYNTHETIC: dict[str, Callable[..., Trace]] = {"chain-3": chain3, "dag-4": dag4, "dag-10-wide": dag10_wide}


def chain2(
    n_tasks: int = DEFAULT_N_TASKS,
    rate: float | None = None,
    seed: int = DEFAULT_SEED,
    prefix_tokens: Lengths | None = None,
    input_tokens: Lengths | None = None,
    output_tokens: Lengths | None = None,
) -> Trace:
    """Chain-2, the mechanism case (notebook 06; not a workload of the paper): A -> B. Defaults:
    prefix 6144, input 512, output 256 tokens; 0.3 tasks/s. Both prefixes take 12,288 of the
    default budget's 18,358 tokens, so serving the two agents at once halves the batch that one
    agent alone would run: whether a scheduler keeps one prefix and a full batch or both prefixes
    and half a batch decides the capacity."""
    return generate("chain-2", n_tasks, rate, seed, prefix_tokens, input_tokens, output_tokens)


#: The mechanism case's generator (committed as ``data/traces/chain-2.json.gz`` beside the
#: synthetic workloads; never part of the paper's grid)
MECHANISM: dict[str, Callable[..., Trace]] = {"chain-2": chain2}


#: Lengths (tokens) and nominal rate of the scaled-down variants (:func:`scaled_down`): the same
#: shapes, small enough that every prefix of a workload plus a batch of its requests fit the
#: ~4,096-token KV pool of the CPU SGLang test server (``make test-sglang``). Not committed traces.
SMALL: dict[str, dict[str, float | int]] = {
    "chain-3": {"prefix_tokens": 256, "input_tokens": 32, "output_tokens": 8, "rate": 2.0},
    "dag-4": {"prefix_tokens": 192, "input_tokens": 32, "output_tokens": 8, "rate": 2.0},
    "dag-10-wide": {"prefix_tokens": 128, "input_tokens": 32, "output_tokens": 8, "rate": 1.0},
}


def scaled_down(name: str, n_tasks: int = 6, rate: float | None = None, seed: int = DEFAULT_SEED) -> Trace:
    """A scaled-down ``name`` (lengths from :data:`SMALL`), for tests against a tiny server."""
    if name not in SMALL:
        raise ValueError(f"unknown synthetic workload {name!r} (known: {', '.join(sorted(SMALL))})")
    d = SMALL[name]
    return generate(name, n_tasks, float(d["rate"]) if rate is None else rate, seed,
                    int(d["prefix_tokens"]), int(d["input_tokens"]), int(d["output_tokens"]))
