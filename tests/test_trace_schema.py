"""The published JSON Schema of traces, ``data/traces/schema.json``: every shipped trace is valid
under it, and it refuses what ``topas.workload.validate`` refuses structurally (the rules it cannot
express stay the Python validator's).

Two validators read the schema: jsonschema's (draft 2020-12, the reference) and fastjsonschema's,
which compiles it to Python and checks a 40,000-stage trace in half a second where jsonschema takes
ten. Every shipped trace is checked by the compiled one, one /1 and one /2 trace by both, and both
must refuse every hostile document below."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from topas.paths import REPO_ROOT
from topas.workload.validate import TraceError, validate_dict

jsonschema = pytest.importorskip("jsonschema")
fastjsonschema = pytest.importorskip("fastjsonschema")

TRACES = REPO_ROOT / "data" / "traces"
SCHEMA = json.loads((TRACES / "schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
COMPILED = fastjsonschema.compile(SCHEMA)


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


#: one /1 and one /2 trace, checked by the reference validator too (seconds each)
BOTH = ("chain-3.json.gz", "metagpt-tl-raw.json.gz")


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.json.gz")), ids=lambda p: p.name)
def test_every_shipped_trace_is_valid_under_the_schema(path):
    d = json.loads(gzip.decompress(path.read_bytes()))
    assert d["schema"] in ("topas.trace/1", "topas.trace/2")
    COMPILED(d)  # raises, naming the first error
    if path.name in BOTH:
        errors = [e.message for e in VALIDATOR.iter_errors(d)]
        assert not errors, errors[:3]


def v1() -> dict:
    return {"schema": "topas.trace/1", "name": "t", "meta": {},
            "agents": [{"name": "a", "prefix_tokens": 8, "expected_output_tokens": 4.0}],
            "tasks": [{"id": "t0", "arrival": 0.0, "workflow": "w",
                       "stages": [{"id": "A", "agent": "a", "input_tokens": 4, "output_tokens": 2, "parents": []}]}]}


def with_(path: str, value) -> dict:
    d = copy.deepcopy(v1())
    *head, last = path.split(".")
    node = d
    for k in head:
        node = node[int(k)] if k.isdigit() else node[k]
    node[int(last) if last.isdigit() else last] = value
    return d


HOSTILE = {
    "empty task list": with_("tasks", []),
    "arrival 1e300": with_("tasks.0.arrival", 1e300),
    "arrival 1e18": with_("tasks.0.arrival", 1e18),
    "negative arrival": with_("tasks.0.arrival", -1.0),
    "zero tokens": with_("tasks.0.stages.0.input_tokens", 0),
    "10**10 tokens": with_("tasks.0.stages.0.output_tokens", 10**10),
    "float tokens": with_("agents.0.prefix_tokens", 8.5),
    "control character in a name": with_("name", "t\x07"),
    "slash in a task id": with_("tasks.0.id", "a/b"),
    "unknown field": with_("tasks.0.parent", []),
    "segments in /1": with_("tasks.0.stages.0.segments", ["s"]),
    "unknown schema": with_("schema", "topas.trace/9"),
}


def test_a_minimal_trace_is_valid_under_both():
    validate_dict(v1())
    assert not list(VALIDATOR.iter_errors(v1()))
    COMPILED(v1())  # raises, naming the error, if it refuses


@pytest.mark.parametrize("what", list(HOSTILE))
def test_the_schema_and_the_validator_both_refuse(what):
    d = HOSTILE[what]
    assert list(VALIDATOR.iter_errors(d)), f"the schema accepts {what}"
    with pytest.raises(fastjsonschema.JsonSchemaException):
        COMPILED(d)
    with pytest.raises(TraceError):
        validate_dict(d)
