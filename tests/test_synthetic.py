"""Synthetic workloads (Chain-3, DAG-4, DAG-10-Wide), Poisson arrivals, re-timing, and the
committed trace files."""

from __future__ import annotations

import gzip
import importlib.util
import math
from pathlib import Path

import pytest

from topas.paths import REPO_ROOT
from topas.workload import SYNTHETIC, poisson_arrivals, read_trace, retime, trace_to_dict, write_trace
from topas.workload.synthetic import DEFAULTS, SHAPES, chain3, dag4, dag10_wide

TRACES = REPO_ROOT / "data" / "traces"


def parents(trace):
    return {s.id: s.parents for s in trace.tasks[0].stages}


# ----------------------------------------------------------------------------- shapes


def test_chain3_shape():
    t = chain3(n_tasks=5)
    assert t.name == "chain-3"
    assert parents(t) == {"A": (), "B": ("A",), "C": ("B",)}
    assert list(t.agents) == ["chain3.A", "chain3.B", "chain3.C"]


def test_dag4_shape():
    t = dag4(n_tasks=5)
    assert parents(t) == {"A": (), "B": ("A",), "C": ("A",), "D": ("B", "C")}
    assert [s.agent for s in t.tasks[0].stages] == ["dag4.A", "dag4.B", "dag4.C", "dag4.D"]


def test_dag10_wide_shape():
    t = dag10_wide(n_tasks=5)
    p = parents(t)
    middle = list("BCDEFGHI")
    assert len(p) == 10 and len(t.agents) == 10
    assert p["A"] == () and all(p[m] == ("A",) for m in middle) and p["J"] == tuple(middle)
    assert all(name.startswith("dag10wide.") for name in t.agents)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_each_stage_has_its_own_agent_and_fixed_lengths(name):
    t = SYNTHETIC[name](n_tasks=20)
    d = DEFAULTS[name]
    assert len(t.tasks) == 20 and [x.id for x in t.tasks][:2] == ["t00000", "t00001"]
    for task in t.tasks:
        assert task.workflow == name
        assert len({s.agent for s in task.stages}) == len(task.stages)
        for s in task.stages:
            assert (s.input_tokens, s.output_tokens) == (d["input_tokens"], d["output_tokens"])
            assert type(s.input_tokens) is int and type(s.output_tokens) is int
    for a in t.agents.values():
        assert a.prefix_tokens == d["prefix_tokens"] and type(a.prefix_tokens) is int
        assert a.expected_output_tokens == float(d["output_tokens"])  # the nominal output: a prior


def test_per_stage_lengths_and_params_in_meta():
    t = dag4(n_tasks=3, rate=2.0, seed=7, prefix_tokens={"A": 100, "B": 200, "C": 300, "D": 400},
             output_tokens={"A": 1, "B": 2, "C": 3, "D": 4})
    assert [a.prefix_tokens for a in t.agents.values()] == [100, 200, 300, 400]
    assert [a.expected_output_tokens for a in t.agents.values()] == [1.0, 2.0, 3.0, 4.0]
    assert [s.output_tokens for s in t.tasks[0].stages] == [1, 2, 3, 4]
    m = t.meta
    assert m["generator"] == "topas.workload.synthetic.dag4"
    assert (m["seed"], m["rate"]) == (7, 2.0)
    assert m["params"] == {"n_tasks": 3, "prefix_tokens": {"A": 100, "B": 200, "C": 300, "D": 400},
                           "input_tokens": DEFAULTS["dag-4"]["input_tokens"], "output_tokens": {"A": 1, "B": 2, "C": 3, "D": 4}}


def test_meta_regenerates_the_trace():
    t = chain3(n_tasks=10, seed=4, input_tokens=500)
    m = t.meta
    assert SYNTHETIC[t.name](**m["params"], rate=m["rate"], seed=m["seed"]) == t


@pytest.mark.parametrize("kwargs, match", [
    ({"n_tasks": 0}, "n_tasks"),
    ({"input_tokens": 0}, "input_tokens of stage A"),
    ({"output_tokens": 2.0}, "output_tokens of stage A"),
    ({"prefix_tokens": {"A": 1, "B": 1}}, "exactly the stages A, B, C, D"),
    ({"rate": 0}, "rate"),
])
def test_bad_generator_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dag4(**kwargs)


# ----------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_same_seed_same_bytes(tmp_path, name):
    a = write_trace(SYNTHETIC[name](n_tasks=200, seed=11), tmp_path / "a.json.gz").read_bytes()
    b = write_trace(SYNTHETIC[name](n_tasks=200, seed=11), tmp_path / "b.json.gz").read_bytes()
    c = write_trace(SYNTHETIC[name](n_tasks=200, seed=12), tmp_path / "c.json.gz").read_bytes()
    assert a == b
    assert a != c


def test_committed_traces_regenerate_bit_for_bit(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("make_traces", REPO_ROOT / "scripts" / "make_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    written = mod.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in written) == ["chain-2.json.gz", "chain-3.json.gz", "dag-10-wide.json.gz",
                                               "dag-4-10k.json.gz", "dag-4.json.gz"]
    assert "wrote" in capsys.readouterr().out
    for p in written:
        committed = (TRACES / p.name).read_bytes()
        new = p.read_bytes()
        # the JSON payload first (a clearer failure), then the gzip bytes themselves
        assert gzip.decompress(new) == gzip.decompress(committed), f"{p.name}: content differs"
        assert new == committed, f"{p.name}: same content, different gzip bytes (another zlib?)"


def test_make_traces_only(tmp_path):
    spec = importlib.util.spec_from_file_location("make_traces", REPO_ROOT / "scripts" / "make_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert [p.name for p in mod.main(["--out", str(tmp_path), "--only", "dag-4"])] == ["dag-4.json.gz"]


def test_the_long_dag4_trace_starts_with_dag4():
    long, short = read_trace(TRACES / "dag-4-10k.json.gz"), read_trace(TRACES / "dag-4.json.gz")
    assert long.name == "dag-4-10k" and len(long.tasks) == 10_000
    assert long.tasks[:1000] == short.tasks and long.agents == short.agents


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_committed_trace_is_the_default_generator_output(name):
    t = read_trace(TRACES / f"{name}.json.gz")
    assert t.name == name and len(t.tasks) == 1000
    assert t.meta["params"]["prefix_tokens"] == DEFAULTS[name]["prefix_tokens"]


# ----------------------------------------------------------------------------- the trade-off the paper is about


def kv_budget() -> int:
    """The default profile's KV budget (18,358 tokens when the defaults were chosen)."""
    try:
        from topas.engine.cost import load_profile

        return load_profile("a100-80gb_qwen2.5-32b").kv_budget_tokens
    except (ImportError, ValueError):  # the engine or the profile is not there (yet)
        return 18_358


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_defaults_make_the_prefix_vs_batch_trade_off_bite(name):
    """All prefixes of a workload plus a useful batch (16 requests) do not fit in the KV budget;
    one prefix plus that batch does; every single request fits (see data/traces/README.md)."""
    b = kv_budget()
    d = DEFAULTS[name]
    n_agents = len(SHAPES[name])
    request = d["input_tokens"] + d["output_tokens"]
    batch = 16 * request
    why = f"the {name} defaults were chosen for a KV budget of 18,358 tokens; the profile now says {b}: " \
          "revisit DEFAULTS and data/traces/README.md"
    assert n_agents * d["prefix_tokens"] + batch > b, why
    assert d["prefix_tokens"] + batch <= b, why
    read_trace(TRACES / f"{name}.json.gz", kv_budget=b)  # every request fits on its own


def test_dag10_wide_agents_cannot_all_be_resident_with_a_batch():
    d = DEFAULTS["dag-10-wide"]
    assert 10 * d["prefix_tokens"] > kv_budget()  # not even without a batch


# ----------------------------------------------------------------------------- Poisson arrivals


def test_poisson_arrivals_basic():
    a = poisson_arrivals(5, 2.0, seed=0)
    assert len(a) == 5 and a[0] == 0.0
    assert all(x <= y for x, y in zip(a, a[1:]))
    assert a == poisson_arrivals(5, 2.0, seed=0)
    assert a != poisson_arrivals(5, 2.0, seed=1)
    assert poisson_arrivals(0, 1.0, 0) == [] and poisson_arrivals(1, 1.0, 0) == [0.0]
    assert all(round(x, 6) == x for x in a)


@pytest.mark.parametrize("rate", [0.05, 1.0, 40.0])
def test_poisson_mean_rate(rate):
    n = 200_000
    a = poisson_arrivals(n, rate, seed=123)
    measured = (n - 1) / (a[-1] - a[0])
    assert measured == pytest.approx(rate, rel=0.01)  # std of the estimate ~ 1/sqrt(n) = 0.22%
    gaps = [y - x for x, y in zip(a[:20_001], a[1:20_001])]
    cv = math.sqrt(sum((g - 1 / rate) ** 2 for g in gaps) / len(gaps)) * rate
    assert cv == pytest.approx(1.0, abs=0.05)  # exponential gaps: std == mean


@pytest.mark.parametrize("rate", [0, -1.0, math.inf, math.nan, None, True])
def test_bad_rate_is_named(rate):
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(10, rate, seed=0)


def test_bad_n_and_seed():
    with pytest.raises(ValueError, match="n must be"):
        poisson_arrivals(-1, 1.0, 0)
    with pytest.raises(ValueError, match="seed must be"):
        poisson_arrivals(3, 1.0, None)


def test_retime_keeps_tasks_and_order():
    t = dag4(n_tasks=100, seed=0)
    r = retime(t, rate=2.0, seed=5)
    assert [x.id for x in r.tasks] == [x.id for x in t.tasks]
    assert [x.stages for x in r.tasks] == [x.stages for x in t.tasks]
    assert r.agents == t.agents
    assert [x.arrival for x in r.tasks] == poisson_arrivals(100, 2.0, 5)
    assert r.meta["rate"] == 2.0 and r.meta["arrival_seed"] == 5
    assert r.meta["params"] == t.meta["params"]
    assert retime(t, 2.0, 5) == r  # the same trajectories for every policy
    assert retime(t, 2.0, 6) != r
    with pytest.raises(ValueError, match="rate"):
        retime(t, 0.0, 1)


def test_retimed_trace_round_trips(tmp_path):
    r = retime(chain3(n_tasks=20), rate=0.7, seed=2)
    assert read_trace(write_trace(r, tmp_path / "r.json.gz")) == r
    assert trace_to_dict(r)["meta"]["arrival_process"] == "poisson"
