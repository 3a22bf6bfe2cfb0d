"""Trace validation: every rule of topas.trace/1 rejects bad input with a message that names the
file, the item (task/stage or agent) and the rule broken."""

from __future__ import annotations

import copy
import math

import pytest

from topas.workload import TraceError, trace_from_dict, validate_trace
from topas.workload.validate import SUPPORTED_SCHEMAS, find_cycle, topological_order
from conftest import good_trace_dict as good

SRC = "data/x.json.gz"


def reject(d: dict, *fragments: str, kv_budget: int | None = None) -> TraceError:
    with pytest.raises(TraceError) as ei:
        trace_from_dict(d, kv_budget=kv_budget, source=SRC)
    msg = str(ei.value)
    assert msg.startswith(SRC + ": "), msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return ei.value


def stage(d: dict, task: int, sid: str) -> dict:
    return next(s for s in d["tasks"][task]["stages"] if s["id"] == sid)


def test_good_trace_loads():
    t = trace_from_dict(good(), kv_budget=1000, source=SRC)
    assert [x.id for x in t.tasks] == ["t00000", "t00001"]
    assert t.num_requests == 8


def test_trace_error_is_a_value_error_with_location_attributes():
    d = good()
    stage(d, 1, "C")["parents"] = ["Z"]
    e = reject(d)
    assert isinstance(e, ValueError)
    assert (e.source, e.task, e.stage) == (SRC, "t00001", "C")
    assert str(e) == "data/x.json.gz: task t00001 stage C: parent 'Z' does not exist in the task"


def test_trace_error_survives_pickling():
    import pickle

    d = good()
    stage(d, 1, "C")["parents"] = ["Z"]
    e = pickle.loads(pickle.dumps(reject(d)))
    assert isinstance(e, TraceError)
    assert str(e) == "data/x.json.gz: task t00001 stage C: parent 'Z' does not exist in the task"
    assert (e.source, e.task, e.stage, e.rule) == (SRC, "t00001", "C", "parent 'Z' does not exist in the task")


# ----------------------------------------------------------------------------- schema version


def test_missing_schema_lists_supported_versions():
    d = good()
    del d["schema"]
    reject(d, "missing field 'schema'", "topas.trace/1")


def test_unknown_schema_version_lists_supported_versions():
    d = good()
    d["schema"] = "topas.trace/9"
    reject(d, "unsupported schema version 'topas.trace/9'", *SUPPORTED_SCHEMAS)


def test_not_an_object():
    with pytest.raises(TraceError, match="must be a JSON object"):
        trace_from_dict([], source=SRC)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- missing / unknown fields


@pytest.mark.parametrize("field", ["name", "meta", "agents", "tasks"])
def test_missing_top_level_field(field):
    d = good()
    del d[field]
    reject(d, "top level", f"missing field '{field}'")


@pytest.mark.parametrize("field", ["prefix_tokens", "expected_output_tokens"])
def test_missing_agent_field(field):
    d = good()
    del d["agents"][1][field]
    reject(d, "agent b", f"missing field '{field}'")


def test_agent_without_name_is_located_by_position():
    d = good()
    del d["agents"][1]["name"]
    reject(d, "agents[1]", "missing field 'name'")


@pytest.mark.parametrize("field", ["arrival", "workflow", "stages"])
def test_missing_task_field(field):
    d = good()
    del d["tasks"][1][field]
    reject(d, "task t00001", f"missing field '{field}'")


@pytest.mark.parametrize("field", ["agent", "input_tokens", "output_tokens", "parents"])
def test_missing_stage_field(field):
    d = good()
    del stage(d, 0, "B")[field]
    reject(d, "task t00000 stage B", f"missing field '{field}'")


def test_stage_without_id_is_located_by_position():
    d = good()
    del d["tasks"][0]["stages"][2]["id"]
    reject(d, "task t00000 stages[2]", "missing field 'id'")


def test_unknown_field_is_rejected_not_ignored():
    d = good()
    s = stage(d, 0, "D")
    s["parent"] = s.pop("parents")
    reject(d, "task t00000 stage D", "missing field 'parents'")
    s["parents"] = ["B", "C"]
    reject(d, "task t00000 stage D", "unknown field 'parent'")


def test_wrong_types():
    d = good()
    d["tasks"][0]["stages"] = {"A": {}}
    reject(d, "task t00000", "stages must be an array")
    d = good()
    stage(d, 0, "B")["parents"] = "A"
    reject(d, "task t00000 stage B", "parents must be an array")
    d = good()
    d["tasks"][1]["id"] = 7
    reject(d, "tasks[1]", "id must be a string")


def test_empty_task():
    d = good()
    d["tasks"][1]["stages"] = []
    reject(d, "task t00001", "at least one stage")


# ----------------------------------------------------------------------------- duplicates and references


def test_duplicate_agent_names():
    d = good()
    d["agents"].append({"name": "a", "prefix_tokens": 1, "expected_output_tokens": 1.0})
    reject(d, "agent a", "duplicate agent name")


def test_duplicate_task_ids():
    d = good()
    d["tasks"][1]["id"] = "t00000"
    reject(d, "task t00000", "duplicate task id")


def test_duplicate_stage_ids_within_a_task():
    d = good()
    stage(d, 1, "C")["id"] = "B"
    reject(d, "task t00001 stage B", "duplicate stage id")


def test_same_stage_ids_in_different_tasks_are_fine():
    trace_from_dict(good(), source=SRC)  # both tasks have stages A..D


def test_unknown_agent():
    d = good()
    stage(d, 1, "D")["agent"] = "nobody"
    reject(d, "task t00001 stage D", "unknown agent 'nobody'")


def test_missing_parent():
    d = good()
    stage(d, 0, "C")["parents"] = ["Z"]
    reject(d, "task t00000 stage C", "parent 'Z' does not exist in the task")


def test_parent_listed_twice():
    d = good()
    stage(d, 0, "B")["parents"] = ["A", "A"]
    reject(d, "task t00000 stage B", "parent 'A' is listed twice")


@pytest.mark.parametrize("where", ["task", "stage"])
def test_slash_in_ids_is_rejected(where):
    d = good()
    if where == "task":
        d["tasks"][1]["id"] = "t/1"
        reject(d, "task t/1", "must not contain '/'")
    else:
        stage(d, 1, "A")["id"] = "A/1"
        reject(d, "task t00001 stage A/1", "must not contain '/'")


# ----------------------------------------------------------------------------- cycles


def test_cycle_names_the_stages_on_it():
    d = good()
    stage(d, 1, "B")["parents"] = ["A", "D"]  # B -> D -> B
    e = reject(d, "task t00001", "cycle", "B -> D -> B")
    assert "A" not in e.rule.split("cycle")[1]


def test_longer_cycle():
    d = good()
    stage(d, 0, "A")["parents"] = ["D"]  # A -> B -> D -> A (and A -> C -> D -> A)
    reject(d, "task t00000 stage A", "cycle: A -> B -> D -> A")


def test_self_loop():
    d = good()
    stage(d, 0, "C")["parents"] = ["C"]
    reject(d, "task t00000 stage C", "cycle: C -> C")


def test_find_cycle_and_topological_order_helpers():
    dag = [("A", []), ("C", ["A"]), ("B", ["A"]), ("D", ["B", "C"])]
    assert find_cycle(dag) == []
    assert topological_order(dag) == ["A", "C", "B", "D"]  # ties by declaration order
    assert topological_order([("D", ["B", "C"]), ("B", ["A"]), ("C", ["A"]), ("A", [])]) == ["A", "B", "C", "D"]
    cyc = [("A", ["C"]), ("B", ["A"]), ("C", ["B"]), ("X", [])]
    assert topological_order(cyc) is None
    assert find_cycle(cyc) == ["A", "B", "C"]


# ----------------------------------------------------------------------------- lengths


@pytest.mark.parametrize(
    "value, why",
    [(0, "zero"), (-3, "negative"), (3.0, "3.0"), (2.5, "2.5"), (True, "boolean"), ("12", "'12'"), (None, "null")],
)
@pytest.mark.parametrize("field", ["input_tokens", "output_tokens"])
def test_bad_stage_lengths(field, value, why):
    d = good()
    stage(d, 1, "C")[field] = value
    reject(d, "task t00001 stage C", f"{field} must be a positive integer", why)


@pytest.mark.parametrize("value, why", [(0, "zero"), (-1, "negative"), (4096.0, "4096.0"), (False, "boolean")])
def test_bad_prefix_length(value, why):
    d = good()
    d["agents"][0]["prefix_tokens"] = value
    reject(d, "agent a", "prefix_tokens must be a positive integer", why)


@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, True, "5"])
def test_bad_expected_output_tokens(value):
    d = good()
    d["agents"][1]["expected_output_tokens"] = value
    reject(d, "agent b", "expected_output_tokens must be a finite number > 0")


# ----------------------------------------------------------------------------- arrivals


@pytest.mark.parametrize("value", [-0.5, math.inf, math.nan, None, True, "1.0"])
def test_bad_arrival(value):
    d = good()
    d["tasks"][0]["arrival"] = value
    reject(d, "task t00000", "arrival must be a finite number >= 0")


def test_arrivals_out_of_order_name_both_tasks():
    d = good()
    d["tasks"][0]["arrival"] = 2.0
    reject(d, "task t00001", "arrival 1.5 is earlier than the arrival 2.0 of the preceding task t00000",
           "non-decreasing")


def test_equal_arrivals_are_fine():
    d = good()
    d["tasks"][1]["arrival"] = 0  # an integer arrival is fine too
    assert trace_from_dict(d, source=SRC).tasks[1].arrival == 0.0


# ----------------------------------------------------------------------------- KV budget


def test_prefix_larger_than_budget_names_the_agent():
    reject(good(), "agent b", "prefix of 200 tokens is larger than the KV budget of 150 tokens", kv_budget=150)


def test_request_that_does_not_fit_names_task_stage_and_numbers():
    # a: 100 + D's 40 + 5 = 145 > 140; b's prefix 200 > 140 would be caught first, so shrink it
    d = good()
    d["agents"][1]["prefix_tokens"] = 80
    e = reject(d, "task t00000 stage D", "prefix 100 + input 40 + output 5 = 145 tokens > budget 140 tokens",
               kv_budget=140)
    assert (e.task, e.stage) == ("t00000", "D")


def test_budget_exactly_enough_is_fine():
    trace_from_dict(good(), kv_budget=200 + 30 + 5, source=SRC)


def test_bad_budget_argument():
    with pytest.raises(ValueError, match="kv_budget"):
        trace_from_dict(good(), kv_budget=0, source=SRC)


# ----------------------------------------------------------------------------- built traces


def test_validate_trace_after_bad_retiming():
    t = trace_from_dict(good(), source=SRC)
    validate_trace(t)
    bad = t.with_arrivals([3.0, 1.0])
    with pytest.raises(TraceError, match=r"<trace tiny>: task t00001: arrival 1.0 is earlier .* t00000"):
        validate_trace(bad)
    with pytest.raises(TraceError, match="my-source: task t00000: arrival must be"):
        validate_trace(t.with_arrivals([-1.0, 1.0]), source="my-source")


def test_validate_trace_checks_budget():
    t = trace_from_dict(good(), source=SRC)
    with pytest.raises(TraceError, match="agent b: prefix of 200 tokens"):
        validate_trace(t, kv_budget=199)


def test_nothing_is_half_loaded():
    """A problem in the last stage of the last task is found before anything is built."""
    d = good()
    before = copy.deepcopy(d)
    stage(d, 1, "D")["output_tokens"] = 0
    reject(d, "task t00001 stage D")
    stage(d, 1, "D")["output_tokens"] = 5
    assert d == before  # validation does not modify its input


def test_max_new_tokens_is_optional_and_at_least_the_output():
    d = good()
    s = stage(d, 0, "D")
    s["max_new_tokens"] = s["output_tokens"] + 100
    t = trace_from_dict(d, source=SRC)
    assert next(x for x in t.tasks[0].stages if x.id == "D").max_new == s["output_tokens"] + 100
    assert next(x for x in t.tasks[0].stages if x.id == "A").max_new_tokens is None  # absent: y
    s["max_new_tokens"] = s["output_tokens"] - 1
    reject(d, "task t00000 stage D", f"max_new_tokens {s['output_tokens'] - 1} is smaller than output_tokens")
    for bad in (0, 2.0, True, "8"):
        s["max_new_tokens"] = bad
        reject(d, "task t00000 stage D", "max_new_tokens")


def test_max_new_tokens_counts_in_the_budget_rule():
    d = good()
    s = stage(d, 0, "D")
    prefix = next(a for a in d["agents"] if a["name"] == s["agent"])["prefix_tokens"]
    budget = max(a["prefix_tokens"] for a in d["agents"]) + max(
        x["input_tokens"] + x["output_tokens"] for t in d["tasks"] for x in t["stages"])
    trace_from_dict(d, kv_budget=budget)  # every prefix and request fits
    s["max_new_tokens"] = budget - prefix - s["input_tokens"] + 1
    reject(d, "task t00000 stage D", f"+ max_new_tokens {s['max_new_tokens']}", f"> budget {budget}", kv_budget=budget)


# ----------------------------------------------------------------------------- topas.trace/2: segments

from conftest import good_trace_v2_dict as good2  # noqa: E402


def seg(d: dict, gid: str) -> dict:
    return next(g for g in d["segments"] if g["id"] == gid)


def test_good_v2_trace_loads_with_its_segments_shared():
    t = trace_from_dict(good2(), source=SRC)
    a, b = t.tasks[0].stage_map["A"], t.tasks[0].stage_map["B"]
    assert [g.id for g in a.segments] == ["P", "H", "C", "U0"]
    assert a.segments[2] is b.segments[2]  # one Segment object per id
    assert sum(g.tokens for g in a.segments) == t.agents["a"].prefix_tokens + a.input_tokens


def _swap_kinds(d: dict) -> None:
    """H (after P) becomes task t00000's context, C (after H) a shared segment."""
    c = seg(d, "C")
    del c["task"], c["origin"]
    c["kind"] = "shared"
    seg(d, "H").update(kind="context", task="t00000", origin="A")


def _v2(mutate):
    d = good2()
    mutate(d)
    return d


@pytest.mark.parametrize("mutate, fragments", [
    (lambda d: d.pop("segments"), ["top level", "missing field 'segments'"]),
    (lambda d: stage(d, 0, "A").pop("segments"), ["task t00000 stage A", "missing field 'segments'"]),
    (lambda d: seg(d, "H").update(tokens=0), ["segment H", "tokens must be a positive integer"]),
    (lambda d: seg(d, "H").update(kind="header"), ["segment H", "kind must be one of prefix, shared, context, unique"]),
    (lambda d: seg(d, "H").update(colour="red"), ["segment H", "unknown field 'colour'"]),
    (lambda d: d["segments"].append({"id": "H", "tokens": 2, "kind": "shared"}), ["duplicate segment id"]),
    (lambda d: stage(d, 0, "A")["segments"].__setitem__(3, "Z"), ["task t00000 stage A", "unknown segment 'Z'"]),
    (lambda d: stage(d, 0, "A").update(input_tokens=11),
     ["task t00000 stage A", "segments add up to 14 tokens, not the prompt's prefix_tokens 4 + input_tokens 11 = 15"]),
    (lambda d: stage(d, 0, "A").update(segments=["P", "H", "C", "U0", "U0"], input_tokens=13),
     ["task t00000 stage A", "segment 'U0' is listed twice"]),
    (lambda d: seg(d, "H").update(kind="prefix"),
     ["task t00000 stage A", "prefix segment 'H' ends at token 6, beyond the agent prefix of 4 tokens"]),
    (lambda d: _swap_kinds(d), ["task t00000 stage A", "shared segment 'C' after a context one"]),
    (lambda d: seg(d, "C").pop("origin"), ["task t00000 stage A", "context segment 'C' must name its task and origin"]),
    (lambda d: seg(d, "H").update(task="t00000"), ["task t00000 stage A", "shared segment 'H' must not name a task"]),
    (lambda d: seg(d, "C").update(origin="B"),
     ["task t00000 stage A", "names origin 'B', but the first stage of the task (topological order) that holds it is this one"]),
    (lambda d: stage(d, 1, "A").update(segments=["P", "H", "C", "V"], input_tokens=14),
     ["task t00001 stage A", "context segment 'C' belongs to task t00000, not to this one"]),
    (lambda d: stage(d, 0, "B").update(segments=["P", "H", "C", "U0"], input_tokens=10),
     ["task t00000 stage B", "unique segment 'U0' is also held by stage A"]),
    (lambda d: stage(d, 0, "B").update(segments=["P", "C", "U1"], input_tokens=11),
     ["task t00000 stage B", "segment 'C' follows 'P' here but 'H' elsewhere"]),
    (lambda d: d["agents"][0].update(prefix_tokens=5) or stage(d, 0, "A").update(input_tokens=9)
     or stage(d, 0, "B").update(input_tokens=12) or stage(d, 1, "A").update(input_tokens=8),
     ["task t00000 stage A", "no segment boundary at the agent prefix (prefix_tokens 5)"]),
    (lambda d: d["segments"].append({"id": "X", "tokens": 2, "kind": "shared"}),
     ["segment X", "segment is held by no stage"]),
])
def test_v2_rules_reject_with_the_item_named(mutate, fragments):
    reject(_v2(mutate), *fragments)


def test_v1_document_may_not_carry_segments():
    d = good()
    stage(d, 0, "A")["segments"] = ["P"]
    reject(d, "task t00000 stage A", "unknown field 'segments'")


def test_built_v2_trace_checks_one_segment_per_id():
    import dataclasses

    t = trace_from_dict(good2(), source=SRC)
    validate_trace(t)
    s = t.tasks[0].stages[1]
    other = dataclasses.replace(s.segments[2], tokens=6)
    bad = dataclasses.replace(s, segments=s.segments[:2] + (other,) + s.segments[3:], input_tokens=14)
    t2 = type(t)(t.name, t.agents, (dataclasses.replace(t.tasks[0], stages=(t.tasks[0].stages[0], bad)),)
                 + t.tasks[1:], t.meta)
    with pytest.raises(TraceError, match="segment C is .* here but .* in another stage"):
        validate_trace(t2)
    # slicing and re-timing keep the segments (they live in the stages)
    validate_trace(t.head(1))
    assert t.head(1).has_segments


# ---- a checked trace is checked once: its first tasks and re-timed copies keep the check

def _validations(monkeypatch) -> list[int]:
    from topas.workload import validate as v

    calls: list[int] = []
    full = v._check_all
    monkeypatch.setattr(v, "_check_all", lambda trace, *a: calls.append(len(trace.tasks)) or full(trace, *a))
    return calls


def test_a_checked_trace_its_head_and_its_retimed_copy_are_not_checked_again(monkeypatch):
    calls = _validations(monkeypatch)
    t = trace_from_dict(good(), source=SRC)
    validate_trace(t, kv_budget=1000)
    head = t.head(1)
    retimed = head.with_arrivals([5.0])
    for x in (t, head, retimed, retimed.with_meta({"rate": 1.0})):
        validate_trace(x, kv_budget=1000)
        validate_trace(x)  # no budget rule: what a check under a budget covers
    assert calls == [2]


def test_a_budget_not_checked_before_is_checked_in_full(monkeypatch):
    calls = _validations(monkeypatch)
    t = trace_from_dict(good(), source=SRC)
    validate_trace(t)
    validate_trace(t.head(1).with_arrivals([0.0]), kv_budget=1000)
    assert calls == [2, 1]
    with pytest.raises(TraceError, match="larger than the KV budget of 150 tokens"):
        validate_trace(t.head(1), kv_budget=150)


def test_a_retimed_copy_still_has_its_arrival_times_checked():
    t = trace_from_dict(good(), source=SRC)
    validate_trace(t)
    with pytest.raises(TraceError, match="earlier than the arrival 3.0 of the preceding task t00000"):
        validate_trace(t.with_arrivals([3.0, 1.0]), source=SRC)
    with pytest.raises(TraceError, match="arrival must be a finite number >= 0, got nan"):
        validate_trace(t.with_arrivals([math.nan, 1.0]), source=SRC)


def test_a_retimed_task_shares_the_tables_of_its_dag():
    t = trace_from_dict(good(), source=SRC)
    retimed = t.with_arrivals([1.0, 2.0])
    for old, new in zip(t.tasks, retimed.tasks):
        assert new.arrival != old.arrival and new.stages is old.stages
        assert new.topo_order is old.topo_order and new.children is old.children and new.stage_map is old.stage_map
