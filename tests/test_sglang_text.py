"""Text prompts for a text-matching router (topas.sglang.text) and metadata in the request id.

No SGLang needed; the tokenizer is checked with the ``tokenizers`` package where it is installed
(the SGLang CPU env), and its file is checked byte for byte everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from topas.sglang import text as T
from topas.sglang.adapter import RequestMeta, meta_from_request, rid_with_meta, short_rid
from topas.sglang.tokens import ID_HIGH, ID_LOW, prefix_ids, request_ids
from topas.workload.synthetic import scaled_down


def test_one_character_per_token_id_and_back():
    ids = [3, ID_LOW, 12345, ID_HIGH - 1, 31999]
    s = T.ids_to_text(ids)
    assert len(s) == len(ids) and T.text_to_ids(s) == ids
    assert all(0xF0000 <= ord(c) <= 0xFFFFD for c in s)  # Supplementary Private Use Area-A
    with pytest.raises(ValueError, match="token id 1 has no text"):
        T.ids_to_text([1])  # <s>: a special token
    with pytest.raises(ValueError, match=r"character 1 \('b', U\+0062\) is not a token's text"):
        T.text_to_ids(T.id_to_char(5) + "b")


def test_requests_of_an_agent_share_exactly_its_prefix_as_text():
    a1 = T.request_text("dag4.A", 192, "run1", 0, "t0", "A", 32)
    a2 = T.request_text("dag4.A", 192, "run1", 7, "t3", "A", 32)
    b = T.request_text("dag4.B", 192, "run1", 1, "t0", "B", 32)
    assert len(a1) == len(a2) == 192 + 32
    common = os.path.commonprefix([a1, a2])
    assert len(common) == 192  # the prefix, and not one character of the inputs
    assert T.text_to_ids(a1) == request_ids("dag4.A", 192, "run1", 0, "t0", "A", 32)
    assert os.path.commonprefix([a1, b]) == ""


@pytest.mark.parametrize("workload", ["chain-3", "dag-4"])
def test_the_test_traces_agents_share_no_leading_token(workload):
    """The router's tree matches characters: agents whose prefixes began alike would partly match
    each other, which the simulator's model (a whole prefix or nothing) does not have."""
    trace = scaled_down(workload, 2)
    firsts = [prefix_ids(a, ag.prefix_tokens)[0] for a, ag in trace.agents.items()]
    assert len(set(firsts)) == len(firsts)


def test_suffixes_of_one_run_never_share_their_first_token():
    heads = {T.request_text("A", 4, "r", i, f"t{i}", "S", 5)[4] for i in range(500)}
    assert len(heads) == 500


def test_the_tokenizer_file_is_deterministic_and_spells_every_id(tmp_path):
    j = T.tokenizer_json(32000)
    assert j == T.tokenizer_json(32000)
    vocab = j["model"]["vocab"]
    assert len(vocab) == 32000 and sorted(vocab.values()) == list(range(32000))
    assert [vocab[t] for t in T.SPECIAL_TOKENS] == [0, 1, 2]
    assert all(vocab[T.id_to_char(i)] == i for i in (3, 1000, 31999))
    assert j["post_processor"] is None and j["normalizer"] is None  # no BOS added, nothing rewritten
    with pytest.raises(ValueError, match="vocab_size must be in"):
        T.tokenizer_json(2)
    p1, p2 = T.write_tokenizer(tmp_path, 32000, 8192)
    first = hashlib.sha256(p1.read_bytes()).hexdigest()
    mtime = p1.stat().st_mtime_ns
    T.write_tokenizer(tmp_path, 32000, 8192)  # idempotent: not rewritten
    assert p1.stat().st_mtime_ns == mtime and hashlib.sha256(p1.read_bytes()).hexdigest() == first
    p1.read_text(encoding="ascii")  # plain ASCII on disk
    assert json.loads(p2.read_text())["add_bos_token"] is False


def test_the_tokenizer_encodes_the_text_to_exactly_its_ids(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    T.write_tokenizer(tmp_path, 32000, 8192)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = request_ids("chain3.A", 256, "run", 3, "t1", "A", 32)
    enc = tok.encode(T.ids_to_text(ids))
    assert enc.ids == ids
    assert tok.decode(ids) == T.ids_to_text(ids)


def _meta() -> RequestMeta:
    return RequestMeta(run="r1", t0=1.0, task="t0", stage="B", workflow="w", arrival=0.0, ready=0.5,
                       dag=(("A", "a", 3, ()), ("B", "b", 4, ("A",))), agents=(("a", 10, 2.0), ("b", 10, 2.0)),
                       policy="topas", params=(("beta", 0.5),))


def test_metadata_travels_in_the_request_id_when_custom_params_are_dropped():
    m = _meta()
    rid = rid_with_meta("r1:t0/B", m)
    assert short_rid(rid) == "r1:t0/B" and short_rid("plain") == "plain"
    assert meta_from_request(None, rid) == m
    assert meta_from_request({}, rid) == m
    # custom_params win when both are there
    other = RequestMeta(**{**m.__dict__, "stage": "A"})
    assert meta_from_request({"topas": other.to_json()}, rid) == other
    assert meta_from_request(None, "r1:t0/B") is None
    with pytest.raises(ValueError, match="malformed topas metadata in the request id"):
        meta_from_request(None, "x#topas={not json")
    with pytest.raises(ValueError, match="already contains"):
        rid_with_meta(rid, m)
