"""The output-length model of the offline responder (stdlib only; runs in the MetaGPT venvs and in
the package's tests).

Why a model: on a machine without an LLM the offline responder (``responder.py``) answers
MetaGPT's calls itself. The *structure* of a run (which roles call, in which order, with which
prompts, how many files get written, reviewed and tested) is MetaGPT's own; the *length* of each
answer is what this module decides. MetaGPT publishes only project-level numbers for its
SoftwareDev benchmark (MetaGPT paper, Table 1: 31,255 tokens per project on average, 5.1 code
files, 124.3 tokens per line of code); no per-role or per-call statistics. So:

- the number of code files of a project is drawn from :data:`N_FILES_PMF`, whose mean is 5.1
  (MetaGPT's published mean);
- the answer of each call is a lognormal number of tokens with the action's median
  (:data:`MEDIAN_TOKENS`) and a common spread :data:`SIGMA`; the medians were set from the
  shape of each action's answer format (a PRD/design/task JSON of a few hundred tokens, a code
  file of ~250 lines / 5.1 files ~ 50 lines ~ 450 tokens, a one-word review verdict with a short
  review), then scaled together by one factor (:data:`SCALE`) so that the recorded per-project
  total (prompt + completion tokens of every call, cl100k) of the offline MetaGPT-SOP runs lands
  near 31,255. Calibration: SCALE 0.45 gave 38,681 tokens/project over 150 SOP runs; 0.30 gives
  31,425 (median 29,882; 5.23 files/project) for the committed trace (data/traces/README.md).
  The token total is matched, not MetaGPT's 124.3 tokens per line of code: at this scale a code
  answer is ~23 lines of ~7.5 tokens, because 0.8.2's prompts (design + tasks + code in every
  review and test call) dominate the total.

Every draw is a pure function of a string key (the run and call id): the same key gives the same
length on every machine (``random.Random(int)`` is stable across CPython versions).
"""

from __future__ import annotations

import hashlib
import math
import random

#: Number of code files per project -> probability. Mean = 5.1 (MetaGPT paper, SoftwareDev).
N_FILES_PMF: dict[int, float] = {3: 0.10, 4: 0.25, 5: 0.30, 6: 0.20, 7: 0.10, 8: 0.05}

#: Median answer length (tokens, before :data:`SCALE`) per action kind.
MEDIAN_TOKENS: dict[str, float] = {
    # MetaGPT-SOP (0.8.2)
    "WritePRD": 650.0,  # PRD JSON: goals, user stories, competitive analysis, requirement pool, UI draft
    "WritePRD.issue_type": 8.0,  # small ActionNode probes (bug fix? related?)
    "WriteDesign": 600.0,  # design JSON: approach, file list, class diagram, call flow
    "WriteTasks": 420.0,  # task JSON: packages, logic analysis, task list, shared knowledge
    "WriteCode": 420.0,  # one code file (~50 lines)
    "WriteCodeReview": 160.0,  # review points, actions, LGTM/LBTM verdict
    "WriteCodeReview.rewrite": 420.0,  # rewritten code file after an LBTM
    "SummarizeCode": 260.0,
    "IsPass": 12.0,
    "WriteTest": 300.0,  # one unittest file
    "RunCode": 70.0,  # PASS/FAIL summary of a test run
    "DebugError": 350.0,
    # MetaGPT-TL (main): RoleZero command turns and the tools they run
    "RoleZero.think": 150.0,  # a JSON list of commands with a short thought
    "RoleZero.reply": 80.0,
    "Engineer2.write": 420.0,  # a code file written through Editor.write
    "default": 200.0,
}

#: Log-space standard deviation of every action's length.
SIGMA = 0.35

#: One factor on all medians (calibration to MetaGPT's published 31,255 tokens/project).
SCALE = 0.30

#: Shortest and longest answer the model gives (tokens).
MIN_TOKENS, MAX_TOKENS = 4, 4096

#: Probability that a code review answers LBTM (asks for a rewrite) instead of LGTM.
P_LBTM = 0.2

#: Probability that an ActionNode (JSON) answer is malformed, which makes MetaGPT retry the call.
P_BAD_JSON = 0.03


def _rng(key: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big"))


def median_tokens(action: str) -> float:
    """The median length of ``action``'s answers (``default`` for an unknown action), scaled."""
    return MEDIAN_TOKENS.get(action, MEDIAN_TOKENS["default"]) * SCALE


def output_tokens(action: str, key: str) -> int:
    """The answer length (tokens) of one call of ``action``; ``key`` identifies the call."""
    mu = math.log(median_tokens(action))
    n = _rng(f"len|{action}|{key}").lognormvariate(mu, SIGMA)
    return int(min(MAX_TOKENS, max(MIN_TOKENS, round(n))))


def n_files(key: str) -> int:
    """The number of code files of a project (``key`` identifies the project)."""
    u = _rng(f"files|{key}").random()
    acc = 0.0
    for k, p in sorted(N_FILES_PMF.items()):
        acc += p
        if u < acc:
            return k
    return max(N_FILES_PMF)


def bernoulli(p: float, key: str) -> bool:
    """A deterministic coin with probability ``p`` for ``key``."""
    return _rng(f"coin|{key}").random() < p


def mean_files() -> float:
    return sum(k * p for k, p in N_FILES_PMF.items())
