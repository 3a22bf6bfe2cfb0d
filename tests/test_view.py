"""What a policy can see: the EngineView carries no true output length and no future task.

A spy policy (FCFS or LPM underneath) records every ``EngineView`` it is given during a busy run
(queueing, chunked prefills, evictions, retractions), and the request views passed to its
``on_finish``/``on_preempt`` hooks. Each is walked recursively, field by field:

* by name: no field is named like an output length (``y``, ``output_tokens``, ...); the only
  output-related fields are the agent's *prior* ``expected_output_tokens`` and the tasks'
  ``observed_output``, which may hold finished stages only (observed after the fact);
* by type: only the view classes (and the cost model) appear: no engine or workload entity
  (``Request``, ``Stage``, ``Task``, ...) that carries ``y`` is reachable;
* by value: the true output lengths are chosen from a range no other number in the view can
  take (prefixes and inputs >= 400 tokens, outputs 301..399, all distinct); such a value appears
  only as a finished stage's ``observed_output``. The tokens ``generated`` so far are allowed (a
  count that passes through other stages' output lengths) and are below the request's own;
* tasks: ``view.tasks`` is exactly the set of tasks that have arrived and not finished, and no
  string in the view names a task that has not arrived.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import pytest

from conftest import ROUND_COST as C
from conftest import PRIOR_OUTPUT, stage, task, trace
from conftest import kept_view
from topas.engine.config import EngineConfig
from topas.engine.cost import CostModel
from topas.engine.simulator import simulate
from topas.engine.view import EngineView, PrefixView, RequestView, StageView, TaskView
from topas.policies.fcfs import FCFS
from topas.policies.lpm import LPM

VIEW_TYPES = (EngineView, PrefixView, RequestView, TaskView, StageView, CostModel)
LEAF_TYPES = (str, int, float, bool, type(None))
OUTPUT_LIKE = re.compile(r"(^|_)(y|yv|y_v)($|_)|output|max_new|new_tokens", re.IGNORECASE)
ALLOWED_OUTPUT_FIELDS = {
    "expected_output_tokens",  # PrefixView: the agent's prior (trace-level, not any call's truth)
    "observed_output",  # TaskView: output lengths of finished stages, observed after the fact
}


def spy(base):
    class Spy(base):
        reads_tasks = True  # it keeps the views, tasks included

        def reset(self) -> None:
            super().reset()
            self.views: list[EngineView] = []
            self.hook_views: list[RequestView] = []

        def decide(self, view):
            self.views.append(kept_view(view))
            return super().decide(view)

        def on_finish(self, request, time, output_tokens):
            super().on_finish(request, time, output_tokens)
            self.hook_views.append(request)

        def on_preempt(self, request, time, by_engine):
            super().on_preempt(request, time, by_engine)
            self.hook_views.append(request)

    return Spy()


def walk(obj, path="view"):
    """Yield (path, field name or None, value) for every value reachable from ``obj``."""
    if isinstance(obj, LEAF_TYPES):
        yield path, None, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        assert isinstance(obj, VIEW_TYPES), f"{path}: a {type(obj).__name__} is reachable from the view"
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            yield f"{path}.{f.name}", f.name, value
            yield from walk(value, f"{path}.{f.name}")
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from walk(k, f"{path}[key]")
            yield from walk(v, f"{path}[{k!r}]")
    elif isinstance(obj, (tuple, list, frozenset, set)):
        for i, v in enumerate(obj):
            yield from walk(v, f"{path}[{i}]")
    else:
        raise AssertionError(f"{path}: unexpected {type(obj).__name__} in the view")


# Outputs 301..399 (distinct); prefixes and inputs >= 400, so KV counts and token totals are
# either 0 or >= 401 and cannot coincide with an output length. Each call carries a
# max_new_tokens cap (the client's, a request parameter a scheduler reads) 1,000 above its output,
# so the engine's reservations, which follow the cap, do not reveal the output either.
_Y = iter(range(301, 400))
CAP = 1000


def _capped(s):
    return dataclasses.replace(s, max_new_tokens=s.output_tokens + CAP)


def _busy_trace():
    tasks = []
    for i in range(8):
        k = i % 3
        stages = [stage("A", "P", 400 + 10 * i, next(_Y)),
                  stage("B", "Q", 420 + k, next(_Y), "A"),
                  stage("C", "R", 410 + i, next(_Y), "A"),
                  stage("D", "P", 400, next(_Y), "BC")]
        tasks.append(task(f"job{i}", 1.5 * i, *map(_capped, stages)))
    return trace({"P": 500, "Q": 450, "R": 400}, tasks)


TRACE = _busy_trace()
TRUE_Y = {f"{t.id}/{s.id}": s.output_tokens for t in TRACE.tasks for s in t.stages}
assert len(set(TRUE_Y.values())) == len(TRUE_Y) and PRIOR_OUTPUT not in TRUE_Y.values()
# tight enough for queueing, evictions and retractions, chunked prefill at 256 tokens
CONFIG = EngineConfig(kv_budget=2600, max_prefill_tokens=256)


@pytest.fixture(scope="module", params=[FCFS, LPM], ids=["fcfs", "lpm"])
def spied(request):
    policy = spy(request.param)
    res = simulate(TRACE, policy, C, CONFIG)
    # the run is busy enough that the views show queues, running batches and finished stages
    assert res.summary["queue_time_mean"] > 0 and res.summary["prefix_evictions"] > 0
    assert any(v.waiting and v.running for v in policy.views)
    assert any(any(t.done for t in v.tasks.values()) for v in policy.views)
    return policy, res


def test_no_field_of_the_view_is_an_output_length(spied):
    policy, _ = spied
    seen_output_fields = set()
    for obj in [*policy.views, *policy.hook_views]:
        for path, name, _value in walk(obj):
            if name is not None and OUTPUT_LIKE.search(name):
                assert name in ALLOWED_OUTPUT_FIELDS, f"{path}: the view has an output-like field {name!r}"
                seen_output_fields.add(name)
    assert seen_output_fields == ALLOWED_OUTPUT_FIELDS  # the allowed ones are really there


def test_no_object_in_the_view_carries_the_true_output_length(spied):
    policy, _ = spied
    truths = set(TRUE_Y.values())
    for view in policy.views:
        for path, name, value in walk(view):
            if path.endswith(".generated"):
                continue  # tokens produced so far (checked below: always short of the request's total)
            if path.endswith(".reserve"):
                continue  # the engine's reservation, from the cap (checked below)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value in truths:
                # allowed: a finished stage's observed output, under TaskView.observed_output
                assert ".observed_output[" in path, f"{path} = {value}: a true output length is visible"
        for t in view.tasks.values():
            assert set(t.observed_output) == set(t.done)
            for s, y in t.observed_output.items():
                assert y == TRUE_Y[f"{t.id}/{s}"]  # correct, and only once the stage finished
        for r in (*view.waiting, *view.running):
            assert 0 <= r.generated < TRUE_Y[r.rid]  # progress so far, never the total
        for r in view.waiting:  # a waiting request's reservation: its whole remaining cap
            assert r.reserve == TRUE_Y[r.rid] + CAP - r.generated
        for r in view.running:  # a running one's: new_token_ratio of it
            assert 0 <= r.reserve <= TRUE_Y[r.rid] + CAP - r.generated


def test_the_view_covers_exactly_the_arrived_unfinished_tasks(spied):
    policy, res = spied
    arrival = dict(zip(res.tasks["task_id"], res.tasks["arrival"]))
    finish = dict(zip(res.tasks["task_id"], res.tasks["finish"]))
    for view in policy.views:
        t = view.time
        active = {tid for tid in arrival if arrival[tid] <= t < finish[tid]}
        assert set(view.tasks) == active, f"at t={t}"
        for tv in view.tasks.values():
            assert tv.arrival <= t and len(tv.done) < len(tv.stages)
        assert {r.task_id for r in (*view.waiting, *view.running)} <= active
        future = {tid for tid in arrival if arrival[tid] > t}
        for path, _name, value in walk(view):
            if isinstance(value, str):
                assert value.split("/")[0] not in future, f"{path} = {value!r} names a future task at t={t}"


def test_views_are_immutable_snapshots(spied):
    policy, _ = spied
    view = next(v for v in policy.views if v.waiting)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.time = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.waiting[0].generated = 10**6  # type: ignore[misc]
    # a later view is a new snapshot: the earlier one did not change under the policy's feet
    later = policy.views[-1]
    assert later is not view and later.time > view.time
