"""Run experiments on a Ray cluster (the optional ``ray`` extra: ``pip install 'topas[ray]'``).

:func:`topas.experiments.run_sweep` and :func:`topas.experiments.run_many` use this module
instead of local processes when given ``ray_address`` (or when ``$TOPAS_RAY_ADDRESS`` is set,
which is how ``scripts/reproduce.py --ray-address`` reaches the notebooks' kernels):

* ``"local"``: start a Ray instance on this machine for the sweep (and stop it afterwards);
* ``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"``: connect to a running cluster
  (``ray start --head`` on one machine, ``ray start --address=...`` on the others);
* whatever the address, a Ray session already open in this process (``ray.init(...)`` called by
  the user or a test) is used as it is and left open.

Each experiment is one Ray task (``num_cpus=1``) that *returns* its result to the driver, which
writes it to the results store as it arrives. The cluster's nodes therefore need no shared
filesystem, and a killed sweep keeps every result that reached the driver, exactly as on local
processes. Every node must have the same ``topas`` installed (``pip install -e '.[ray]'`` in
the same checkout) and the traces and profiles the experiments name; results carry the driver's
``topas_version`` and ``git_commit``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence, TypeVar

from tqdm.auto import tqdm

from topas.errors import ExperimentFailed
from topas.experiments.spec import Experiment

__all__ = ["RAY_ADDRESS_ENV", "resolve_address", "map_experiments_ray"]

T = TypeVar("T")

#: Environment variable naming the Ray address when a call gives none.
RAY_ADDRESS_ENV = "TOPAS_RAY_ADDRESS"


def resolve_address(ray_address: str | None) -> str | None:
    """The address to use: ``ray_address`` if given, else ``$TOPAS_RAY_ADDRESS``, else ``None``
    (no Ray: local processes). An empty string means ``None``."""
    if ray_address is None:
        ray_address = os.environ.get(RAY_ADDRESS_ENV)
    if ray_address is None or not str(ray_address).strip():
        return None
    if not isinstance(ray_address, str):
        raise TypeError(f"ray_address must be a string, got {ray_address!r}")
    return ray_address.strip()


def _import_ray():
    try:
        import ray  # lazy: Ray is an optional extra, and slow to import
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("sweeps on Ray need the optional extra: pip install 'topas[ray]'") from e
    return ray


def map_experiments_ray(
    fn: Callable[[Experiment], T],
    exps: Sequence[Experiment],
    address: str,
    progress: bool = True,
    desc: str = "experiments",
    on_result: Callable[[Experiment, T], None] | None = None,
) -> list[T]:
    """``[fn(e) for e in exps]`` as Ray tasks, in the input order, with a tqdm bar.

    ``on_result(exp, value)`` runs in the driver as each task finishes (the results store writes
    there). The first failure cancels the tasks still pending and raises
    :class:`topas.experiments.ExperimentFailed` naming the experiment; values already passed to
    ``on_result`` are kept.
    """
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address != "local":
            kwargs["address"] = address
        ray.init(**kwargs)
        started = True
    out: list[Any] = [None] * len(exps)
    bar = tqdm(total=len(exps), desc=desc, unit="run", disable=not progress)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {remote.remote(e): i for i, e in enumerate(exps)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = refs[ref]
                try:
                    value = ray.get(ref)
                except Exception as err:
                    for p in pending:
                        ray.cancel(p, force=True)
                    cause = getattr(err, "cause", None) or err
                    raise ExperimentFailed(f"experiment {exps[i].label()} failed on Ray: {cause}") from cause
                if on_result is not None:
                    on_result(exps[i], value)
                out[i] = value
                bar.update(1)
    finally:
        bar.close()
        if started:
            ray.shutdown()
    return out
