"""Token ids for replaying a trace without a tokenizer (SGLang ``input_ids``).

Requests of the same agent share *exactly* the agent's prefix: ``l_a`` ids drawn from a
generator seeded by the agent's name (stable across processes, machines and runs: the plugin
recomputes them to pin a prefix in the radix tree). The suffix of every request is unique: its
first ids encode a run salt and the request's index in the run, so no two requests share a
token past the agent prefix (and a request never shares its suffix with an earlier run's), and
the rest are drawn from a generator seeded by (run, task, stage).

Ids lie in ``[ID_LOW, ID_HIGH)``, inside any vocabulary of at least 32,000 tokens and above the
usual special-token range.
"""

from __future__ import annotations

import hashlib

import numpy as np

ID_LOW = 1000
ID_HIGH = 31000
_SPAN = ID_HIGH - ID_LOW


def _seed(*parts: str) -> int:
    h = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "little")


def prefix_ids(agent: str, n: int) -> list[int]:
    """The agent's prefix: ``n`` ids, a deterministic function of the agent's name."""
    if n <= 0:
        return []
    rng = np.random.default_rng(_seed("topas-prefix", agent))
    return (rng.integers(0, _SPAN, size=n) + ID_LOW).tolist()


def suffix_ids(run: str, index: int, task: str, stage: str, n: int) -> list[int]:
    """``n`` suffix ids, unique to (run, request index): see the module docstring.

    The first id is ``(salt + index) mod span``: distinct for every request of a run of fewer than
    30,000 requests, so no two requests share a token past the agent prefix, and shifted by the
    run's salt so that a later run on an unflushed server rarely hits an earlier run's suffix.
    Then ``index // span`` and the salt; the rest is pseudo-random."""
    if n <= 0:
        return []
    salt = _seed("topas-run", run) % _SPAN
    head = [ID_LOW + (salt + index) % _SPAN, ID_LOW + (index // _SPAN) % _SPAN, ID_LOW + salt]
    rng = np.random.default_rng(_seed("topas-suffix", run, task, stage))
    rest = (rng.integers(0, _SPAN, size=max(n - 3, 0)) + ID_LOW).tolist()
    return (head + rest)[:n]


def request_ids(agent: str, prefix_tokens: int, run: str, index: int, task: str, stage: str,
                input_tokens: int) -> list[int]:
    """A request's full ``input_ids``: the agent prefix then its unique suffix (``x_v`` tokens)."""
    return prefix_ids(agent, prefix_tokens) + suffix_ids(run, index, task, stage, input_tokens)
