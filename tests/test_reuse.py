"""What a perfect radix cache reuses, computed from a trace alone: each request's longest prefix
shared with an earlier request, split into cross-task and within-task."""

from __future__ import annotations

from pathlib import Path

import pytest

from topas.workload import read_trace, trace_from_dict
from topas.workload.reuse import perfect_cache_reuse, reuse_lines
from conftest import good_trace_v2_dict

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_reuse_of_a_hand_built_trace():
    # requests in trace order (prompt = segments, tokens):
    #   t00000/A  P4 H2 C5 U0 3 = 14  nothing earlier                 -> 0
    #   t00000/B  P4 H2 C5 U1 6 = 17  P H C as t00000/A: same task   -> within 11
    #   t00001/A  P4 H2 V7      = 13  P H as t00000's calls           -> cross 6
    #   t00001/B  Pb3 W2        =  5  agent b's first call           -> 0
    # prompt tokens 49, reused 17 = 34.7%: cross 6, within 11
    r = perfect_cache_reuse(trace_from_dict(good_trace_v2_dict()))
    assert (r.requests, r.prompt_tokens, r.cross_task, r.within_task) == (4, 49, 6, 11)
    assert r.share(r.reused) == pytest.approx(17 / 49)


def test_cross_task_is_what_other_tasks_give_within_task_what_the_own_task_adds():
    # t00001/A also holding t00000's context C: it now reuses P H C (11 tokens) across tasks
    d = good_trace_v2_dict()
    d["segments"][2].update(kind="shared")
    del d["segments"][2]["task"], d["segments"][2]["origin"]
    d["segments"][5]["tokens"] = 2  # V shrinks so that t00001/A keeps 13 prompt tokens
    d["tasks"][1]["stages"][0]["segments"] = ["P", "H", "C", "V"]
    r = perfect_cache_reuse(trace_from_dict(d))
    assert (r.prompt_tokens, r.cross_task, r.within_task) == (49, 11, 11)


def test_v1_trace_reuses_agent_prefixes_only():
    # the same trace as topas.trace/1: prompt = agent prefix + own input.
    #   t00000/A 0; t00000/B a's prefix 4 (within); t00001/A a's prefix 4 (cross); t00001/B 0
    d = good_trace_v2_dict()
    d["schema"] = "topas.trace/1"
    del d["segments"]
    for t in d["tasks"]:
        for s in t["stages"]:
            del s["segments"]
    r = perfect_cache_reuse(trace_from_dict(d))
    assert (r.prompt_tokens, r.cross_task, r.within_task) == (49, 4, 4)
    assert "agent-prefix model" in reuse_lines(trace_from_dict(d))[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name, share", [("metagpt-sop", 48.7), ("metagpt-tl", 84.5), ("metagpt-tl-raw", 5.0)])
def test_shipped_metagpt_traces_reuse_what_their_token_sequences_do(name, share):
    # the shares of the recorded calls' real token sequences (longest common token prefix with any
    # earlier call; data/traces/README.md "Segments")
    r = perfect_cache_reuse(read_trace(TRACES / f"{name}.json.gz"))
    assert 100 * r.share(r.reused) == pytest.approx(share, abs=1.0)
