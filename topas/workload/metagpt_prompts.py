"""The text of a recorded MetaGPT call, as :mod:`topas.workload.metagpt` measures it: the prompt
rendered as one string (:func:`render`), its volatile values masked (:func:`normalise`) or the
current time made distinct per call (:func:`distinct_time`), token prefixes shared by many calls
(:func:`common_prefix_len`) and the tokenizer (:func:`tiktoken_encoder`, cl100k_base)."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Callable, Mapping, Sequence

#: The current time RoleZero writes into its system prompts ("... The current time is
#: 2025-06-30 19:45:55."), what ``time="distinct"`` replaces.
CURRENT_TIME = re.compile(r"(The current time is )\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")

#: The first call's current time under ``time="distinct"``; call ``k`` (trace order) gets ``k`` s later.
DISTINCT_TIME_BASE = _dt.datetime(2025, 7, 1, 9, 0, 0)

Encoder = Callable[[str], Sequence[int]]

# ----------------------------------------------------------------------------- normalisation

_NORMALISERS: tuple[tuple[re.Pattern[str], str], ...] = (
    # 2025-06-30 19:45:55, 2025-06-30T19:45:55.123+08:00
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"), "<DATETIME>"),
    (re.compile(r"\b\d{14}\b"), "<DATETIME>"),  # 20250630194555 (MetaGPT's document file names)
    (re.compile(r"\b\d{4}[-/]\d{2}[-/]\d{2}\b"), "<DATE>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<TIME>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<ID>"),  # uuid4().hex message ids
    # epoch seconds (2017..2033), e.g. Engineer2's "{project_name}_1795951056" folder in its instruction
    (re.compile(r"(?<!\d)1[5-9]\d{8}(?!\d)"), "<EPOCH>"),
)


def normalise(text: str, workdir: str = "") -> str:
    """``text`` with volatile values replaced: the run's working directory (``workdir``, the
    recorded ``METAGPT_PROJECT_ROOT``, part of workspace paths), date-times, dates, clock times,
    32-hex ids and epoch seconds."""
    if workdir:
        text = text.replace(workdir, "<WORKDIR>")
    for pat, rep in _NORMALISERS:
        text = pat.sub(rep, text)
    return text


def render(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt as one string: ``<|role|>\\ncontent\\n`` per message (a neutral chat template)."""
    return "".join(f"<|{m.get('role', '')}|>\n{m.get('content', '')}\n" for m in messages)


def distinct_time(text: str, k: int) -> str:
    """``text`` with every :data:`CURRENT_TIME` set to :data:`DISTINCT_TIME_BASE` + ``k`` seconds."""
    when = (DISTINCT_TIME_BASE + _dt.timedelta(seconds=k)).strftime("%Y-%m-%d %H:%M:%S")
    return CURRENT_TIME.sub(lambda m: m.group(1) + when, text)


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of all sequences (0 for none)."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for s in seqs[1:]:
        k = 0
        lim = min(n, len(s))
        while k < lim and s[k] == first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return n


def tiktoken_encoder(encoding: str = "cl100k_base") -> Encoder:
    """tiktoken's ``encoding`` (needs tiktoken and its BPE file: ``TIKTOKEN_CACHE_DIR``, see
    tools/metagpt/README.md); special-token text is encoded as ordinary text."""
    try:
        import tiktoken  # lazy: optional, installed in the MetaGPT venvs only
    except ImportError:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "converting MetaGPT calls needs tiktoken (cl100k_base); run it in a MetaGPT venv "
            "(make metagpt-env) or pass encode=..."
        ) from None
    enc = tiktoken.get_encoding(encoding)
    return lambda s: enc.encode(s, disallowed_special=())
