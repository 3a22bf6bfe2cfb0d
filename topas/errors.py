"""The errors an experiment run raises, shared by the experiment layer and the engines.

They live below both so that an engine (the SGLang replay's server list, its sweep over several
servers) can raise them without importing :mod:`topas.experiments`, which re-exports them.
"""

from __future__ import annotations

__all__ = ["ExperimentError", "ExperimentFailed"]


class ExperimentError(ValueError):
    """A bad experiment spec or an unknown workload; the message names the offending item."""


class ExperimentFailed(RuntimeError):
    """An experiment raised while running; the message names it, ``__cause__`` is the error."""
