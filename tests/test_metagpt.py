"""MetaGPT workloads: the converter (topas/workload/metagpt.py) on recorded calls of our own MetaGPT
runs (tests/fixtures/metagpt/), the offline responder's output-length model and answer formats
(tools/metagpt/), and the committed traces data/traces/metagpt-{sop,tl}.json.gz under every policy.

No MetaGPT and no tiktoken here: the converter takes any tokenizer; these tests use a word-level
one (``words``), so prefix lengths are counted in words.
"""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from topas.workload.metagpt import (
    NOMINAL_RATES,
    calls_to_trace,
    common_prefix_len,
    convert_file,
    distinct_time,
    normalise,
    read_calls,
    render,
)
from topas.workload.validate import TraceError, validate_trace

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).resolve().parent / "fixtures" / "metagpt"
SOP_RUN = FIX / "sop_run.jsonl.gz"


def words(s: str) -> list[str]:
    """A word-level tokenizer: words, single punctuation marks and runs of whitespace."""
    return re.findall(r"\w+|[^\w\s]|\s+", s)


def load_tool(name: str):
    path = REPO / "tools" / "metagpt" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"_metagpt_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def call(run, cid, role, parents=(), t=(0.0, 1.0), system="You are a helper.", user="do it", out=10, **kw):
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]
    rec = {"run_id": run, "call_id": cid, "role": role, "action": f"{role}Action", "parents": list(parents),
           "t_start": t[0], "t_end": t[1], "messages": msgs, "completion_tokens": out, "attempt": 1}
    rec.update(kw)
    return rec


def convert(recs, **kw):
    return calls_to_trace(recs, "metagpt-test", words, rate=0.1, **kw)


# ----------------------------------------------------------------------------- the recorded run


def test_recorded_sop_run_converts_with_its_dependencies():
    recs = read_calls(SOP_RUN)
    tr = convert(recs)
    validate_trace(tr)
    assert len(tr.tasks) == 1
    t = tr.tasks[0]
    assert len(t.stages) == len(recs)
    by_id = {r["call_id"]: r for r in recs}
    for s in t.stages:
        assert list(s.parents) == by_id[s.id]["parents"]  # parents = recorded dependencies
        assert s.output_tokens == max(1, by_id[s.id]["completion_tokens"])
        assert s.agent == by_id[s.id]["role"]  # one system prompt per role in 0.8.2
    # the SOP pipeline: PM -> Architect -> ProjectManager -> Engineer ... -> QaEngineer
    roles = [by_id[s].get("role") for s in t.topo_order]
    assert roles[:3] == ["ProductManager", "Architect", "ProjectManager"]
    assert roles[3] == "Engineer" and roles[-1] == "QaEngineer"
    first = t.stage_map[t.topo_order[0]]
    assert first.parents == ()
    assert tr.meta["runs"][0]["run_id"] == recs[0]["run_id"]


def test_recorded_run_prefix_is_the_shared_token_prefix():
    recs = read_calls(SOP_RUN)
    tr = convert(recs)
    for name, agent in tr.agents.items():
        toks = [words(normalise(render(r["messages"]))) for r in recs if r["role"] == name]
        if len(toks) > 1:
            lcp = common_prefix_len(toks)
            assert agent.prefix_tokens == min(lcp, min(len(x) for x in toks) - 1)
            # the shared prefix covers at least the role's system message
            sys_len = len(words(render([recs[[r["role"] for r in recs].index(name)]["messages"][0]])))
            assert agent.prefix_tokens >= sys_len
        # input = whole prompt - prefix, for every call of the agent
    for s in tr.tasks[0].stages:
        r = next(r for r in recs if r["call_id"] == s.id)
        assert s.input_tokens == len(words(render(r["messages"]))) - tr.agents[s.agent].prefix_tokens


# ----------------------------------------------------------------------------- prefixes


def test_prefix_after_normalising_the_current_time():
    sysmsg = "You are Mike, the team leader. The current time is {}. Be brief."
    recs = [
        call("r0", "c1", "TeamLeader", t=(0, 1), system=sysmsg.format("2025-06-30 19:45:55"), user="alpha beta"),
        call("r0", "c2", "TeamLeader", ["c1"], t=(2, 3), system=sysmsg.format("2025-06-30 19:46:12"), user="alpha gamma"),
        call("r1", "c1", "TeamLeader", t=(0, 1), system=sysmsg.format("2025-07-01 08:00:01"), user="alpha delta"),
    ]
    tr = convert(recs)
    assert list(tr.agents) == ["TeamLeader"]  # one agent despite three different times
    full = words(normalise(render(recs[0]["messages"])))
    shared = words(normalise(render([recs[0]["messages"][0]]) + "<|user|>\nalpha "))
    assert tr.agents["TeamLeader"].prefix_tokens == len(shared)
    assert full[: len(shared)] == shared
    # without normalisation the prefix would stop at the time: prove the times differ
    assert recs[0]["messages"][0]["content"] != recs[1]["messages"][0]["content"]


def test_prefix_single_call_is_its_system_message_and_prefix_is_capped():
    recs = [call("r0", "c1", "Solo", system="one two three", user="four")]
    tr = convert(recs)
    assert tr.agents["Solo"].prefix_tokens == len(words(render([recs[0]["messages"][0]])))
    # identical prompts: the prefix leaves one token of input
    recs = [call("r0", "c1", "Same", t=(0, 1)), call("r0", "c2", "Same", ["c1"], t=(1, 2))]
    tr = convert(recs)
    n = len(words(render(recs[0]["messages"])))
    assert tr.agents["Same"].prefix_tokens == n - 1
    assert all(s.input_tokens == 1 for s in tr.tasks[0].stages)


def test_two_system_prompts_of_one_role_are_two_agents():
    recs = [
        call("r0", "c1", "Engineer", t=(0, 1), system="You are an engineer."),
        call("r0", "c2", "Engineer", ["c1"], t=(1, 2), system="You judge whether the log needs work."),
        call("r0", "c3", "Engineer", ["c2"], t=(2, 3), system="You are an engineer."),
    ]
    tr = convert(recs)
    assert sorted(tr.agents) == ["Engineer", "Engineer:2"]
    assert [s.agent for s in tr.tasks[0].stages] == ["Engineer", "Engineer:2", "Engineer"]


def test_no_system_message_still_gives_a_positive_prefix():
    recs = [call("r0", "c1", "A", system=None, user="x y"), call("r0", "c2", "A", ["c1"], t=(1, 2), system=None, user="z")]
    tr = convert(recs)
    assert tr.agents["A"].prefix_tokens >= 1


# ----------------------------------------------------------------------------- timestamps, retries, failures


def test_timestamps_iso_or_epoch_and_file_order_do_not_matter():
    base = [
        call("r0", "c1", "PM", t=(1751284000.0, 1751284001.5)),
        call("r0", "c2", "Arch", ["c1"], t=(1751284002.0, 1751284003.0)),
        call("r0", "c3", "Eng", ["c2"], t=(1751284004.0, 1751284010.25)),
    ]
    iso = copy.deepcopy(base)
    for r in iso:
        import datetime as dt

        r["t_start"] = dt.datetime.fromtimestamp(r["t_start"], dt.timezone.utc).isoformat()
        r["t_end"] = dt.datetime.fromtimestamp(r["t_end"], dt.timezone.utc).isoformat().replace("+00:00", "Z")
    a, b, c = convert(base), convert(iso), convert(list(reversed(base)))
    assert a.tasks == b.tasks == c.tasks
    assert a.meta["runs"][0]["wall_s"] == pytest.approx(10.25)
    assert [s.id for s in c.tasks[0].stages] == ["c1", "c2", "c3"]  # ordered by (relative) start time


def test_retry_is_a_stage_whose_parent_is_the_failed_attempt():
    recs = [
        call("r0", "c1", "PM", t=(0, 1)),
        call("r0", "c2", "Arch", ["c1"], t=(1, 2), out=300),  # malformed JSON answer
        call("r0", "c3", "Arch", ["c2"], t=(3, 4), out=320, attempt=2, retry_of="c2"),
        call("r0", "c4", "PMgr", ["c3"], t=(4, 5)),
    ]
    tr = convert(recs)
    st = tr.tasks[0].stage_map
    assert set(st) == {"c1", "c2", "c3", "c4"} and st["c3"].parents == ("c2",)
    assert tr.meta["runs"][0]["retries"] == 1


def test_failed_call_is_dropped_and_its_children_inherit_its_parents():
    recs = [
        call("r0", "c1", "PM", t=(0, 1)),
        call("r0", "c2", "Arch", ["c1"], t=(1, 2), out=0, error="APIConnectionError: refused"),
        call("r0", "c3", "Arch", ["c2"], t=(3, 4), attempt=2),
    ]
    tr = convert(recs)
    assert [s.id for s in tr.tasks[0].stages] == ["c1", "c3"]
    assert tr.tasks[0].stage_map["c3"].parents == ("c1",)
    assert tr.meta["runs"][0]["failed_calls"] == 1


def test_runs_become_tasks_in_file_order_with_poisson_arrivals():
    recs = [call("rB", "c1", "PM"), call("rA", "c1", "PM"), call("rC", "c1", "PM")]
    tr = convert(recs)
    assert [r["run_id"] for r in tr.meta["runs"]] == ["rB", "rA", "rC"]
    assert [t.id for t in tr.tasks] == ["t00000", "t00001", "t00002"]
    assert tr.tasks[0].arrival == 0.0 and tr.meta["rate"] == 0.1
    assert all(a.arrival <= b.arrival for a, b in zip(tr.tasks, tr.tasks[1:]))


# ----------------------------------------------------------------------------- bad input


def _write(tmp_path, recs, extra_lines=()):
    p = tmp_path / "calls.jsonl"
    lines = [json.dumps(r) for r in recs] + list(extra_lines)
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("role"), r"line 2 \(run r0 call c2\): missing field 'role'"),
        (lambda r: r.update(parents=["c9"]), r"line 2 \(run r0 call c2\): parent 'c9' is not a call of run r0"),
        (lambda r: r.update(t_end=0.5), r"line 2 \(run r0 call c2\): t_end 0.5 is before t_start 1.0"),
        (lambda r: r.update(t_start=0.5, t_end=2.0), r"line 2 \(run r0 call c2\): parent 'c1' ends at 1.000 s, after"),
        (lambda r: r.update(t_start="yesterday"), r"line 2 \(run r0 call c2\): t_start 'yesterday' is not an ISO-8601"),
        (lambda r: r.update(completion_tokens=-1), r"line 2 \(run r0 call c2\): 'completion_tokens' must be an integer"),
        (lambda r: r.update(messages=[]), r"line 2 \(run r0 call c2\): 'messages' must be a non-empty list"),
        (lambda r: r.update(call_id="c1"), r"line 2 \(run r0 call c1\): duplicate call_id 'c1' in run r0"),
    ],
)
def test_bad_records_name_the_file_line_and_call(tmp_path, mutate, message):
    recs = [call("r0", "c1", "PM", t=(0.0, 1.0)), call("r0", "c2", "Arch", ["c1"], t=(1.0, 2.0))]
    mutate(recs[1])
    p = _write(tmp_path, recs)
    with pytest.raises(TraceError, match=re.escape(str(p)) + ": " + message):
        convert_file(p, "metagpt-test", rate=0.1, encode=words)


def test_bad_json_line_and_cycle(tmp_path):
    p = _write(tmp_path, [call("r0", "c1", "PM")], extra_lines=["{not json"])
    with pytest.raises(TraceError, match=r"calls.jsonl: line 2: not valid JSON"):
        read_calls(p)
    recs = [call("r0", "c1", "PM", ["c2"], t=(0, 1)), call("r0", "c2", "PM", ["c1"], t=(0, 1))]
    with pytest.raises(TraceError, match=r"run r0: the calls' parents form a cycle: c1 -> c2 -> c1"):
        convert(recs)
    with pytest.raises(TraceError, match="no call records"):
        convert([])


# ----------------------------------------------------------------------------- the output-length model


def test_length_model_is_a_deterministic_function_with_metagpt_file_mean():
    lm = load_tool("length_model")
    assert lm.mean_files() == pytest.approx(5.1)  # MetaGPT paper, SoftwareDev: 5.1 code files/project
    assert sum(lm.N_FILES_PMF.values()) == pytest.approx(1.0)
    assert lm.output_tokens("WriteCode", "run/c1") == lm.output_tokens("WriteCode", "run/c1")
    xs = [lm.output_tokens("WriteCode", f"k{i}") for i in range(2000)]
    assert all(lm.MIN_TOKENS <= x <= lm.MAX_TOKENS for x in xs)
    med = sorted(xs)[len(xs) // 2]
    assert med == pytest.approx(lm.median_tokens("WriteCode"), rel=0.05)
    assert lm.median_tokens("no-such-action") == lm.median_tokens("default")
    files = [lm.n_files(f"p{i}") for i in range(4000)]
    assert set(files) <= set(lm.N_FILES_PMF) and sum(files) / len(files) == pytest.approx(5.1, abs=0.08)
    coins = [lm.bernoulli(0.2, f"c{i}") for i in range(4000)]
    assert sum(coins) / len(coins) == pytest.approx(0.2, abs=0.03)


def test_responder_answers_are_well_formed():
    rs = load_tool("responder")
    example = {"Implementation approach": "We will ...", "File list": ["main.py", "game.py"],
               "Data structures and interfaces": "\nclassDiagram\n    class Game", "Anything UNCLEAR": "Clarify ..."}
    prompt = ("## context\nbuild a game\n-----\n## format example\n[CONTENT]\n" + json.dumps(example)
              + "\n[/CONTENT]\n## nodes: ...")
    good = None
    for k in range(20):  # some keys give a malformed answer on purpose; find a well-formed one
        out = rs.action_node_answer(prompt, "WriteDesign", f"run/c{k}", "run")
        body = re.search(r"\[CONTENT\]\s*(\{.*\})\s*\[/CONTENT\]", out, re.DOTALL)
        if body:
            try:
                good = json.loads(body.group(1))
                break
            except json.JSONDecodeError:
                continue
    assert good is not None and set(good) == set(example)
    assert good["File list"][0] == "main.py" and len(good["File list"]) in load_tool("length_model").N_FILES_PMF
    assert good["Data structures and interfaces"].startswith("classDiagram")
    hdr = {"X-Topas-Call": "run/c1", "X-Topas-Run": "run", "X-Topas-Action": "WriteCode"}
    code = rs.answer([{"role": "user", "content": "## Code: game.py\nwrite it"}], hdr)
    src = re.search(r"```python\n(.*?)```", code, re.DOTALL).group(1)
    compile(src, "game.py", "exec")  # valid Python
    review = rs.answer([{"role": "user", "content": "## Code Review Result: str. answer LGTM/LBTM"}],
                       {**hdr, "X-Topas-Action": "WriteCodeReview"})
    assert review.rstrip().splitlines()[-1] in ("LGTM", "LBTM")


# ----------------------------------------------------------------------------- the committed traces


@pytest.mark.parametrize("name", ["metagpt-sop", "metagpt-tl", "metagpt-tl-raw"])
def test_committed_trace_validates_and_runs_under_every_policy(name):
    from topas.engine.cost import load_profile
    from topas.experiments import Experiment, run_experiment
    from topas.experiments.spec import resolve_trace_path
    from topas.policies import available_policies
    from topas.workload.trace_io import read_trace

    path = resolve_trace_path(name)
    assert path.name == f"{name}.json.gz"
    budget = load_profile("a100-80gb_qwen2.5-32b").kv_budget_tokens
    tr = read_trace(path, kv_budget=budget)
    assert tr.meta["rate"] == NOMINAL_RATES[name]
    assert len(tr.tasks) >= 10 and tr.meta["generator"] == "topas.workload.metagpt.calls_to_trace"
    for policy in available_policies():
        res = run_experiment(Experiment(name, policy, load=1.0, seed=0, n_tasks=3))
        assert len(res.tasks) == 3, policy
        assert res.summary["jct_mean"] > 0, policy


def test_recorded_tl_run_normalises_the_current_time(monkeypatch):
    import topas.workload.metagpt as mg

    recs = read_calls(FIX / "tl_run.jsonl.gz")
    times = {re.search(r"current time is ([\d: -]+)", r["messages"][0]["content"]).group(1)
             for r in recs if r["role"] == "TeamLeader" and r["messages"][0]["role"] == "system"
             and "current time is" in r["messages"][0]["content"]}
    assert len(times) > 1  # RoleZero wrote different times into the TeamLeader's system prompt
    tr = convert(recs)
    tl = [r for r in recs if r["role"] == "TeamLeader" and "llm_cached_aask" in r["action"]]
    assert len(tl) >= 3 and all(s.agent == "TeamLeader" for t in tr.tasks for s in t.stages if s.id in {r["call_id"] for r in tl})
    sys_len = len(words(render([tl[0]["messages"][0]])))
    assert tr.agents["TeamLeader"].prefix_tokens >= sys_len  # the whole (long) system prompt is shared
    assert "TeamLeader:2" in tr.agents  # intent classification / language detection prompts
    # without normalisation the raw prompts share only the text before the time ...
    cut = len(words(render([tl[0]["messages"][0]]).split("current time is")[0]))
    assert common_prefix_len([words(render(r["messages"])) for r in tl]) < cut + 20 < sys_len
    # ... and the TeamLeader's command turns would split into one agent per distinct time
    monkeypatch.setattr(mg, "normalise", lambda s, workdir="": s)
    raw = convert(recs)
    tl_ids = {r["call_id"] for r in tl}
    assert len({s.agent for s in raw.tasks[0].stages if s.id in tl_ids}) > 1


def test_the_runs_working_directory_is_masked():
    sysmsg = "You are Bob. Write files under {}/workspace/app. Be brief."
    recs = [
        call("r0", "c1", "Architect", t=(0, 1), system=sysmsg.format("/tmp/x/b001"), workdir="/tmp/x/b001"),
        call("r1", "c1", "Architect", t=(0, 1), system=sysmsg.format("/tmp/x/b002"), workdir="/tmp/x/b002"),
    ]
    tr = convert(recs)
    assert list(tr.agents) == ["Architect"]
    assert tr.agents["Architect"].prefix_tokens >= len(words(render([recs[0]["messages"][0]])))
    assert normalise("at /w/b1/workspace on 2025-06-30 19:45:55", "/w/b1") == "at <WORKDIR>/workspace on <DATETIME>"
    assert normalise("cd {project_name}_1795951056 ") == "cd {project_name}_<EPOCH> "


# ----------------------------------------------------------------------------- segments (topas.trace/2)


def _sharing_reuse(tr, seqs):
    """Per request: reuse over the trace's segments, and over the token sequences (plain trie)."""
    from topas.workload.radix import reuse_of_sequences
    from topas.workload.reuse import request_reuse

    return [c + w for _t, _p, c, w in request_reuse(tr)], reuse_of_sequences(seqs)


def _in_trace_order(tr, recs):
    by = {(r["run_id"], r["call_id"]): r for r in recs}
    runs = {m["task"]: m["run_id"] for m in tr.meta["runs"]}
    return [by[(runs[t.id], s.id)] for t in tr.tasks for s in t.stages]


@pytest.mark.parametrize("fixture", ["sop_run.jsonl.gz", "tl_run.jsonl.gz"])
def test_segments_reuse_exactly_what_the_normalised_prompts_share(fixture):
    recs = read_calls(FIX / fixture)
    recs2 = [dict(r, run_id=r["run_id"] + "-again") for r in recs]  # a second task: cross-task sharing
    tr = convert(recs + recs2)
    assert tr.has_segments
    ordered = _in_trace_order(tr, recs + recs2)
    got, want = _sharing_reuse(tr, [words(normalise(render(r["messages"]), r.get("workdir") or "")) for r in ordered])
    assert got == want and sum(want) > 0
    for t in tr.tasks:
        for s in t.stages:  # the agent prefix is a leading run of segments, all of kind prefix
            cum = [sum(g.tokens for g in s.segments[:k + 1]) for k in range(len(s.segments))]
            assert tr.agents[s.agent].prefix_tokens in cum
            assert all(g.kind == "prefix" for g, c in zip(s.segments, cum) if c <= tr.agents[s.agent].prefix_tokens)


def test_masked_values_longer_than_their_placeholder_are_a_unique_last_segment():
    sysmsg = "You are Mike. The current time is {}. Be brief."
    recs = [call("r0", "c1", "TeamLeader", t=(0, 1), system=sysmsg.format("2025-06-30 19:45:55"), user="a b"),
            call("r1", "c1", "TeamLeader", t=(0, 1), system=sysmsg.format("2025-06-30 19:46:01"), user="a b")]
    tr = convert(recs)
    n_raw, n_norm = len(words(render(recs[0]["messages"]))), len(words(normalise(render(recs[0]["messages"]))))
    assert n_raw > n_norm
    s0, s1 = tr.tasks[0].stages[0], tr.tasks[1].stages[0]
    assert [g.id for g in s0.segments[:-1]] == [g.id for g in s1.segments[:-1]]  # same normalised prompt
    assert s0.segments[-1].kind == s1.segments[-1].kind == "unique" and s0.segments[-1] != s1.segments[-1]
    assert s0.segments[-1].tokens == n_raw - n_norm
    assert sum(g.tokens for g in s0.segments) == n_raw == tr.agents["TeamLeader"].prefix_tokens + s0.input_tokens


def test_distinct_time_gives_every_call_its_own_second_and_shares_only_what_precedes_it():
    sysmsg = "You are Mike. The current time is {}. Be brief."
    recs = [call("r0", "c1", "TeamLeader", t=(0, 1), system=sysmsg.format("2025-06-30 19:45:55"), user="a b"),
            call("r0", "c2", "TeamLeader", ["c1"], t=(2, 3), system=sysmsg.format("2025-06-30 19:45:55"), user="a c")]
    assert distinct_time(sysmsg.format("2025-06-30 19:45:55"), 61) == sysmsg.format("2025-07-01 09:01:01")
    masked, raw = convert(recs), convert(recs, time="distinct")
    assert raw.meta["segments"]["time"] == "distinct" and masked.meta["segments"]["time"] == "masked"
    # the recording's own times repeat; a deployment's do not: the raw variant shares the text up to the time
    upto = len(words(render([{"role": "system", "content": "You are Mike. The current time is 2025-07-01 09:00:00"}])))
    assert raw.agents["TeamLeader"].prefix_tokens < upto - 1 < masked.agents["TeamLeader"].prefix_tokens
    ordered = _in_trace_order(raw, recs)
    got, want = _sharing_reuse(raw, [words(distinct_time(render(r["messages"]), k)) for k, r in enumerate(ordered)])
    assert got == want
    with pytest.raises(ValueError, match="time must be one of masked, distinct"):
        convert(recs, time="raw")
