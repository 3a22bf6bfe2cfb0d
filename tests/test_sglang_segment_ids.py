"""The replay's token ids follow a topas.trace/2 trace's segments (topas.sglang.tokens.stage_ids):
two requests share exactly the token prefix the trace's tree says, and a /1 trace's ids are
byte-identical to the agent-prefix + unique-suffix ids."""

from __future__ import annotations

import hashlib
import json

import pytest

from topas.sglang import text as T
from topas.sglang.tokens import prefix_ids, request_ids, segmented_ids, stage_ids
from topas.workload.model import Agent, Segment, Stage, Task, Trace
from topas.workload.radix import reuse_of_sequences
from topas.workload.reuse import request_reuse
from topas.workload.synthetic import scaled_down
from topas.workload.validate import validate_trace


def _trace() -> Trace:
    """Two tasks of agents a, b: each task's first and last call (agent a) share a 300-token
    context; a shared 50-token header follows a's prefix in every call of a."""
    pa, pb = Segment("pa", 100, "prefix"), Segment("pb", 80, "prefix")
    hdr = Segment("hdr", 50, "shared")
    tasks = []
    for i in range(2):
        t = f"t{i}"
        ctx = Segment(f"ctx{i}", 300, "context", t, "x")
        u = {s: Segment(f"u{i}{s}", 20, "unique", t, s) for s in "xwy"}
        tasks.append(Task(t, float(i), (
            Stage("x", "a", 370, 8, (), segments=(pa, hdr, ctx, u["x"])),
            Stage("w", "b", 20, 8, ("x",), segments=(pb, u["w"])),
            Stage("y", "a", 370, 8, ("w",), segments=(pa, hdr, ctx, u["y"])))))
    trace = Trace("seg", {"a": Agent("a", 100, 8.0), "b": Agent("b", 80, 8.0)}, tuple(tasks))
    validate_trace(trace)
    return trace


def _ids(trace: Trace, run: str = "run") -> list[list[int]]:
    out, k = [], 0
    for t in trace.tasks:
        for s in t.stages:
            out.append(stage_ids(trace, t.id, s, run, k))
            k += 1
    return out


def test_requests_share_exactly_the_prefix_the_segment_tree_says():
    trace = _trace()
    ids = _ids(trace)
    assert [len(x) for x in ids] == [trace.agents[s.agent].prefix_tokens + s.input_tokens
                                     for t in trace.tasks for s in t.stages]
    want = [cross + within for _, _, cross, within in request_reuse(trace)]
    assert reuse_of_sequences(ids) == want
    # the last call of t0 shares the agent prefix, the header and the task's context with its first
    assert want[2] == 100 + 50 + 300
    # t1's first call shares only the prefix and the header with t0 (another task's context)
    assert want[3] == 150
    assert ids[0][:100] == prefix_ids("a", 100)  # what the plugin pins


def test_the_unique_part_is_the_suffix_of_its_run_and_request_index():
    trace = _trace()
    a, b = _ids(trace, "r1"), _ids(trace, "r2")
    assert a == _ids(trace, "r1")  # deterministic
    assert a[0][:100] == b[0][:100] and a[0][100] != b[0][100]  # only the agent prefix crosses runs
    heads = [x[trace.agents[s.agent].prefix_tokens + (350 if s.agent == "a" else 0)]
             for x, s in zip(a, (s for t in trace.tasks for s in t.stages))]
    assert len(set(heads)) == len(heads)


def test_text_mode_spells_the_same_ids():
    trace = _trace()
    ids = _ids(trace)[2]
    assert T.text_to_ids(T.ids_to_text(ids)) == ids  # the client's text mode: ids_to_text(stage_ids(...))


def test_segments_without_a_boundary_at_the_agent_prefix_are_refused():
    with pytest.raises(ValueError, match="task t stage s: no segment boundary at the agent prefix"):
        segmented_ids("a", 10, (Segment("p", 6, "prefix"), Segment("u", 8, "unique", "t", "s")), "r", 0, "t", "s")


def test_a_trace_without_segments_sends_the_ids_it_always_sent():
    trace = scaled_down("dag-4", 3, 1.0, 0)
    k = 0
    for t in trace.tasks:
        for s in t.stages:
            assert stage_ids(trace, t.id, s, "run", k) == request_ids(
                s.agent, trace.agents[s.agent].prefix_tokens, "run", k, t.id, s.id, s.input_tokens)
            k += 1
    # request_ids itself, pinned to the values recorded before segments existed
    ids = [request_ids("dag4.A", 100, "run", i, f"t{i}", "A", 20 + i) for i in range(5)] + \
        [request_ids("x", 0, "r", 3, "t", "s", 7)]
    assert hashlib.sha256(json.dumps(ids).encode()).hexdigest() == \
        "5372b748f3e90f6c2beb1ddf7a40798460d5d3fd6b62208fd1b0abd108ff533a"
