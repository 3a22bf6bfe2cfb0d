"""Fuzzing what enters topas (issue 44): generated traces, policy parameters and loads give a
result or a one-line error, never a traceback or a hang (each case under a timeout). Hypothesis
runs derandomized with small example counts, so the whole file takes seconds and is the same on
every run."""

from __future__ import annotations

import json
import math
import signal
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_runner
from topas.cli import main
from topas.policies import param_names
from topas.workload.validate import TraceError, validate_dict

SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much])
CASE_TIMEOUT_S = 10


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Fail a case that runs longer than ``seconds`` (a hang), via SIGALRM."""
    def on_alarm(*_):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def mostly(valid, hostile) -> st.SearchStrategy:
    """``valid`` nine times in ten, else ``hostile``: most cases run, every field is attacked."""
    return st.integers(0, 9).flatmap(lambda k: hostile if k == 0 else valid)


def pick(values) -> st.SearchStrategy:
    return st.sampled_from(values)


HOSTILE_NUMBERS = [0, -1, 10**10, 2**63, 10**400, 1.5, 3.0, True, "7", None, math.nan, math.inf, -math.inf, 1e300]
HOSTILE_GAPS = [-1.0, math.nan, math.inf, 1e300, 1e18, 1e9 + 1, "0"]
HOSTILE_NAMES = ["", "x/y", "\ud800", "\x00", "\x1b[2J", "é", " ", 5, None]


@st.composite
def trace_docs(draw) -> dict:
    """A trace document: half of them valid, the other half with each field hostile one time in ten."""
    attack = draw(st.booleans())

    def v(valid, hostile):
        return draw(mostly(valid, pick(hostile)) if attack else valid)

    lengths = st.integers(1, 48)
    agent_names = ["a", "b", "c"]
    agents = [{"name": v(st.just(agent_names[k]), HOSTILE_NAMES), "prefix_tokens": v(lengths, HOSTILE_NUMBERS),
               "expected_output_tokens": v(st.floats(1, 64), HOSTILE_NUMBERS)}
              for k in range(draw(st.integers(1, 3)))]
    tasks, t = [], 0.0
    for i in range(v(st.integers(1, 4), [0])):
        gap = v(st.floats(0, 20, allow_nan=False), HOSTILE_GAPS)
        t = t + gap if isinstance(gap, float) and isinstance(t, float) else gap
        stages = []
        for j in range(draw(st.integers(1, 3))):
            earlier = [f"s{k}" for k in range(j)]
            parents = sorted(set(draw(st.lists(pick(earlier), max_size=2)))) if earlier else []
            if attack and draw(st.integers(0, 9)) == 0:
                parents = parents + [draw(pick(["zz", f"s{j}"]))]
            stages.append({"id": f"s{j}", "agent": v(pick(agent_names[:len(agents)]), HOSTILE_NAMES),
                           "input_tokens": v(lengths, HOSTILE_NUMBERS), "output_tokens": v(lengths, HOSTILE_NUMBERS),
                           "parents": parents})
        tasks.append({"id": v(st.just(f"t{i}"), ["t0", "a/b", ""]), "arrival": t, "workflow": "w",
                      "stages": stages})
    return {"schema": v(st.just("topas.trace/1"), ["topas.trace/2", "v9"]),
            "name": v(st.just("fuzz"), ["", "\ud800x", "a\nb"]),
            "meta": v(st.just({"rate": 0.5}), [{}, {"rate": -1}, {"rate": "x"}, {"rate": 1e-300}]),
            "agents": agents, "tasks": tasks}


POLICIES = ["fcfs", "lpm", "spf", "topas", "autellix-las", "topas-plus"]
GOOD_VALUES = ["0", "1", "0.5", "3"]
BAD_VALUES = ["-1", "-5", "inf", "nan", "1e308", "1e400", "abc", "", "true", "9" * 30]


@st.composite
def param_args(draw) -> list[str]:
    policy = draw(st.sampled_from(POLICIES))
    args = ["--policy", policy]
    numeric = [n for n in param_names(policy) if n not in ("output_estimator", "estimator", "group", "rank")]
    for _ in range(draw(st.integers(0, 2))):
        name = draw(mostly(pick(numeric or ["nope"]), pick(param_names(policy) + ["nope"])))
        args += ["--param", f"{name}={draw(mostly(pick(GOOD_VALUES), pick(BAD_VALUES)))}"]
    timing = draw(mostly(pick([[], ["--load", "1"], ["--tasks", "2"], ["--load", "2", "--seed", "3"]]),
                         pick([["--load", "1e-300"], ["--load", "1e300"], ["--rate", "1e-9"],
                               ["--seed", "-1", "--load", "1"]])))
    return args + timing


@pytest.fixture(scope="module")
def runner():
    return make_runner()  # one for the module: hypothesis runs many examples per test


def check_outcome(r) -> None:
    """A result (exit 0), a one-line error (exit 1) or a usage error (exit 2); never a traceback."""
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        import traceback

        raise AssertionError("".join(traceback.format_exception(r.exception)))
    assert r.exit_code in (0, 1, 2), (r.exit_code, r.stderr)
    if r.exit_code == 1:
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in r.stderr


@SETTINGS
@given(doc=trace_docs(), args=param_args())
def test_generated_traces_and_parameters_give_a_result_or_one_line(runner, tmp_path_factory, doc, args):
    path = tmp_path_factory.mktemp("fuzz") / "t.json"
    path.write_text(json.dumps(doc))
    with time_limit(CASE_TIMEOUT_S):
        r = runner.invoke(main, ["simulate", "--trace", str(path), "--no-progress", *args])
        check_outcome(r)
        v = runner.invoke(main, ["trace", "validate", str(path)])
        check_outcome(v)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)


@settings(SETTINGS, max_examples=200)
@given(doc=st.one_of(json_values, trace_docs(), st.builds(lambda d, k, v: {**d, k: v}, trace_docs(),
                                                         st.sampled_from(["agents", "tasks", "meta", "name"]),
                                                         json_values)))
def test_the_validator_raises_only_trace_errors_and_the_schema_accepts_what_it_accepts(doc):
    jsonschema = pytest.importorskip("jsonschema")
    from topas.paths import REPO_ROOT

    try:
        validate_dict(doc, source="fuzz")
    except TraceError:
        return
    schema = json.loads((REPO_ROOT / "data" / "traces" / "schema.json").read_text())
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(json.loads(json.dumps(doc)))]
    assert not errors, errors[:2]
