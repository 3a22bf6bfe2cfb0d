"""Text for replaying a trace through a text-matching router (SGLang router's ``cache_aware``).

The replay normally sends token ids (:mod:`topas.sglang.tokens`) to servers started with
``--skip-tokenizer-init``. A router that routes on the request *text* (``sglang-router``'s
``cache_aware`` policy matches characters in an approximate radix tree) sees no text in such a
request, so it needs text whose tokenization is exactly those ids. This module gives a tokenizer
for the tiny CPU model (``tools/sglang_cpu/make_tiny_model.py`` writes it beside the model's
``config.json``) that makes the mapping exact, one character per token:

* token id ``i`` is the single character ``chr(TEXT_BASE + i)`` (``U+F0000`` + i, Unicode's
  Supplementary Private Use Area-A: 65,534 code points no normaliser or pre-tokeniser touches,
  far from any text a person writes), except the three special tokens ``<unk>``, ``<s>``,
  ``</s>`` (ids 0, 1, 2);
* the tokenizer (``tokenizer.json``, the HF ``tokenizers`` format, written here without that
  package) splits text into single characters and looks each up in a word-level vocabulary;
  it adds no BOS/EOS (no post-processor) and decodes by concatenation;
* so ``encode(ids_to_text(ids)) == ids`` for every id list outside the specials, and a text's
  length in characters is its length in tokens: the router's match rate (matched characters /
  characters) equals the token match rate the simulator's ``sglang-cache-aware`` router uses,
  requests of one agent share exactly the agent's prefix (``l_a`` characters), and nothing past
  it (the suffix's first token is unique in the run, :func:`topas.sglang.tokens.suffix_ids`);
  requests of a ``topas.trace/2`` trace share exactly the segments the trace says
  (:func:`topas.sglang.tokens.stage_ids`, spelled by :func:`ids_to_text`).

Deterministic: the files are a pure function of the vocabulary size (byte-identical across runs
and machines).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from topas.sglang.tokens import request_ids

#: token id i <-> chr(TEXT_BASE + i): Supplementary Private Use Area-A (U+F0000..U+FFFFD)
TEXT_BASE = 0xF0000
#: the largest vocabulary the private-use plane can spell (U+FFFFE/U+FFFFF are non-characters)
MAX_VOCAB = 0xFFFFE - TEXT_BASE
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 (the tiny Llama's bos 1, eos 2)


def id_to_char(i: int) -> str:
    """The one character that spells token id ``i`` (``ValueError`` outside ``[len(SPECIALS), MAX_VOCAB)``)."""
    if not len(SPECIAL_TOKENS) <= i < MAX_VOCAB:
        raise ValueError(f"token id {i} has no text (ids {len(SPECIAL_TOKENS)}..{MAX_VOCAB - 1} have)")
    return chr(TEXT_BASE + i)


def ids_to_text(ids: Sequence[int]) -> str:
    """The text whose tokenization (the tokenizer of :func:`tokenizer_json`) is exactly ``ids``."""
    return "".join(id_to_char(int(i)) for i in ids)


def text_to_ids(text: str) -> list[int]:
    """The inverse of :func:`ids_to_text` (``ValueError`` naming a character it did not write)."""
    out = []
    for k, ch in enumerate(text):
        i = ord(ch) - TEXT_BASE
        if not len(SPECIAL_TOKENS) <= i < MAX_VOCAB:
            raise ValueError(f"character {k} ({ch!r}, U+{ord(ch):04X}) is not a token's text")
        out.append(i)
    return out


def request_text(agent: str, prefix_tokens: int, run: str, index: int, task: str, stage: str,
                 input_tokens: int) -> str:
    """A request's text: :func:`topas.sglang.tokens.request_ids` spelled one character per token."""

    return ids_to_text(request_ids(agent, prefix_tokens, run, index, task, stage, input_tokens))


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
    """The ``tokenizer.json`` (HF ``tokenizers`` format) of the one-character-per-token tokenizer."""
    if not len(SPECIAL_TOKENS) < vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size must be in {len(SPECIAL_TOKENS) + 1}..{MAX_VOCAB}, got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({chr(TEXT_BASE + i): i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, tok in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def tokenizer_config(max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the generic fast tokenizer, no BOS/EOS added, no chat template."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
            "eos_token": "</s>", "add_bos_token": False, "add_eos_token": False,
            "model_max_length": int(max_length), "clean_up_tokenization_spaces": False}


def _dump(obj: Any) -> str:
    # ensure_ascii: the file is plain ASCII (\\u escapes), byte-identical everywhere
    return json.dumps(obj, indent=None, sort_keys=False, ensure_ascii=True, separators=(",", ":")) + "\n"


def write_tokenizer(model_dir: str | os.PathLike, vocab_size: int, max_length: int) -> list[Path]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``model_dir`` (idempotent: a file
    is rewritten, atomically, only when its content differs). Returns the two paths."""
    d = Path(model_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, obj in (("tokenizer.json", tokenizer_json(vocab_size)), ("tokenizer_config.json", tokenizer_config(max_length))):
        p, text = d / name, _dump(obj)
        if not p.exists() or p.read_text(encoding="ascii") != text:
            tmp = p.with_name(f".{name}.tmp")
            tmp.write_text(text, encoding="ascii")
            os.replace(tmp, p)
        paths.append(p)
    return paths
