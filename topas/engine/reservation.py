"""The engine's output reservation: what SGLang's ``PrefillAdder`` promises a request's future
output, as one pure function that the simulator's admission walk and the policy-facing view both
use (``RequestView.reserve``), so that a policy that plans memory plans with the engine's rule.
"""

from __future__ import annotations


def output_reserve(max_new: int, generated: int, clip: int, full: bool, ratio: float) -> int:
    """Tokens reserved for the rest of a request's output: ``min(max_new - generated, clip)``
    (SGLang's ``max_new_tokens`` left, clipped at ``CLIP_MAX_NEW_TOKENS``), in full when ``full``
    (a request being admitted, whose whole remaining output ``add_one_req`` checks; a running
    ``ignore_eos`` request), else scaled by the decaying ``new_token_ratio`` (a running request)."""
    remaining = max_new - generated  # max(min(max_new - generated, clip), 0), without the calls:
    if remaining > clip:  # the engine computes it for every running request at every point
        remaining = clip
    if remaining < 0:
        remaining = 0
    return remaining if full else int(ratio * remaining)
