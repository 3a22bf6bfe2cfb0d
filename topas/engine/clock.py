"""The simulated clock one engine's parts share (docs/design.md, "Engine parts").

:class:`Clock` owns the engine's time: every part reads :attr:`Clock.now`; only the running batch
(:meth:`topas.engine.iterations.Batch.advance`, an iteration's cost) and the scheduler
(:meth:`Clock.wait_until`, an idle engine waiting for the next event) move it.
"""

from __future__ import annotations


class Clock:
    """The engine's simulated time, in seconds (never goes back)."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, dt: float) -> None:
        """An iteration ran for ``dt`` seconds."""
        self.now += dt

    def wait_until(self, t: float) -> None:
        """An idle engine waits until ``t`` (no earlier than now)."""
        self.now = max(self.now, t)
