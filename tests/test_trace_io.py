"""Reading and writing topas.trace/1 files: round trips, determinism, formats, bad files."""

from __future__ import annotations

import gzip
import json

import pytest

from topas.workload import (
    Agent,
    Stage,
    Task,
    Trace,
    TraceError,
    read_trace,
    request_id,
    trace_from_dict,
    trace_to_dict,
    write_trace,
)
from topas.workload.synthetic import dag4
from conftest import good_trace_dict as good

def test_round_trip_gz_and_plain(tmp_path):
    t = trace_from_dict(good(), source="<good>")
    for name in ("tiny.json.gz", "tiny.json"):
        p = write_trace(t, tmp_path / name)
        back = read_trace(p)
        assert back == t
        assert trace_to_dict(back) == trace_to_dict(t)
        assert dict(back.meta) == {"description": "test"}


def test_round_trip_of_a_generated_trace(tmp_path):
    t = dag4(n_tasks=50, seed=3)
    p = write_trace(t, tmp_path / "d.json.gz")
    assert read_trace(p) == t
    assert read_trace(p).tasks[7].stages == t.tasks[7].stages


def test_dict_round_trip():
    d = good()
    assert trace_to_dict(trace_from_dict(d)) == d


def test_writing_is_byte_deterministic(tmp_path):
    t = trace_from_dict(good())
    a = write_trace(t, tmp_path / "a.json.gz").read_bytes()
    b = write_trace(trace_from_dict(good()), tmp_path / "b.json.gz").read_bytes()
    assert a == b
    assert a[4:8] == b"\x00\x00\x00\x00"  # gzip mtime = 0
    text = gzip.decompress(a).decode("ascii")
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")) + "\n"


def test_no_tmp_file_left_behind(tmp_path):
    write_trace(trace_from_dict(good()), tmp_path / "x.json.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json.gz"]


def test_gzip_is_detected_by_content_not_suffix(tmp_path):
    t = trace_from_dict(good())
    gz = write_trace(t, tmp_path / "x.json.gz").read_bytes()
    (tmp_path / "odd.json").write_bytes(gz)
    assert read_trace(tmp_path / "odd.json") == t


def test_stages_are_stored_in_topological_order():
    d = good()
    d["tasks"][0]["stages"].reverse()  # D, C, B, A in the file
    t = trace_from_dict(d)
    assert [s.id for s in t.tasks[0].stages] == ["A", "C", "B", "D"]  # ties in file order: C before B
    assert [s.id for s in t.tasks[1].stages] == ["A", "B", "C", "D"]


def test_types_are_normalized():
    t = trace_from_dict(good())
    b = t.agents["b"]
    assert isinstance(b.expected_output_tokens, float) and b.expected_output_tokens == 5.0
    assert isinstance(t.tasks[0].arrival, float)
    assert t.tasks[0].stages[3].parents == ("B", "C")


def test_request_id():
    assert request_id("t00003", "C") == "t00003/C"


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "nope.json.gz")


def test_invalid_json_names_the_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(TraceError, match=r"bad.json: not valid JSON"):
        read_trace(p)


def test_corrupt_gzip_names_the_file(tmp_path):
    p = tmp_path / "bad.json.gz"
    p.write_bytes(gzip.compress(b'{"schema": "topas.trace/1"}')[:-6])
    with pytest.raises(TraceError, match=r"bad.json.gz: not a valid gzip file"):
        read_trace(p)


def test_read_applies_kv_budget(tmp_path):
    p = write_trace(trace_from_dict(good()), tmp_path / "x.json")
    with pytest.raises(TraceError, match=r"x.json: agent b: prefix of 200 tokens is larger than the KV budget"):
        read_trace(p, kv_budget=150)


def test_write_refuses_an_invalid_trace(tmp_path):
    a = Agent("a", 10, 1.0)
    bad = Trace(name="bad", agents={"a": a},
                tasks=(Task("t0", 0.0, (Stage("A", "a", 0, 1),)),))
    with pytest.raises(TraceError, match=r"bad.json.gz: task t0 stage A: input_tokens must be a positive integer"):
        write_trace(bad, tmp_path / "bad.json.gz")
    assert not any(tmp_path.iterdir())


def test_nan_in_file_is_rejected(tmp_path):
    d = good()
    text = json.dumps(d).replace('"arrival": 1.5', '"arrival": NaN')
    p = tmp_path / "nan.json"
    p.write_text(text)
    with pytest.raises(TraceError, match=r"nan.json: task t00001: arrival must be a finite number"):
        read_trace(p)


def test_max_new_tokens_round_trips_and_is_written_only_when_set(tmp_path):
    d = good()
    d["tasks"][0]["stages"][0]["max_new_tokens"] = d["tasks"][0]["stages"][0]["output_tokens"] + 7
    t = trace_from_dict(d)
    back = read_trace(write_trace(t, tmp_path / "m.json.gz"))
    assert back == t and trace_to_dict(back) == d
    plain = trace_to_dict(trace_from_dict(good()))
    assert all("max_new_tokens" not in s for task in plain["tasks"] for s in task["stages"])


# ----------------------------------------------------------------------------- topas.trace/2

import copy  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import good_trace_v2_dict  # noqa: E402

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
SCHEMA2 = TRACES / "topas.trace-2.schema.json"


def schema2_validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA2.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema2_compiled():
    """The same schema compiled by fastjsonschema (``tests/test_trace_schema.py`` says why two)."""
    fastjsonschema = pytest.importorskip("fastjsonschema")
    return fastjsonschema.compile(json.loads(SCHEMA2.read_text())), fastjsonschema.JsonSchemaException


def test_v2_round_trip_is_byte_deterministic_and_keeps_the_segments(tmp_path):
    d = good_trace_v2_dict()
    t = trace_from_dict(d, source="<good2>")
    p = write_trace(t, tmp_path / "t2.json.gz")
    back = read_trace(p)
    assert back == t and back.has_segments
    out = trace_to_dict(back)
    assert out["schema"] == "topas.trace/2"
    assert out["segments"] == d["segments"]  # the table in order of first use
    assert write_trace(back, tmp_path / "again.json.gz").read_bytes() == p.read_bytes()


def test_a_trace_without_segments_is_still_written_as_v1():
    assert trace_to_dict(dag4(n_tasks=3, seed=0))["schema"] == "topas.trace/1"
    assert "segments" not in trace_to_dict(trace_from_dict(good(), source="<good>"))


def test_the_published_json_schema_accepts_v2_documents_and_rejects_bad_ones():
    v = schema2_validator()
    compiled, refused = schema2_compiled()
    d = good_trace_v2_dict()
    v.validate(d)
    v.validate(trace_to_dict(trace_from_dict(d)))
    compiled(d)
    for mutate in (
        lambda x: x.pop("segments"),
        lambda x: x["tasks"][0]["stages"][0].pop("segments"),
        lambda x: x["segments"][0].update(kind="header"),
        lambda x: x["segments"][2].pop("origin"),  # a context segment names task and origin
        lambda x: x["segments"][1].update(task="t00000"),  # a shared one does not
        lambda x: x["segments"][0].update(tokens=0),
        lambda x: x.update(schema="topas.trace/1"),
    ):
        bad = copy.deepcopy(d)
        mutate(bad)
        assert not v.is_valid(bad), mutate
        with pytest.raises(refused):
            compiled(bad)


@pytest.mark.parametrize("name", ["metagpt-sop", "metagpt-tl", "metagpt-tl-raw"])
def test_shipped_v2_traces_match_the_published_json_schema(name):
    compiled, _ = schema2_compiled()
    d = json.loads(gzip.decompress((TRACES / f"{name}.json.gz").read_bytes()))
    assert d["schema"] == "topas.trace/2"
    compiled(d)  # raises, naming the first error
    if name == "metagpt-tl-raw":  # the reference validator too (seconds a trace)
        errors = sorted(schema2_validator().iter_errors(d), key=lambda e: list(e.path))
        assert not errors, errors[0].message
