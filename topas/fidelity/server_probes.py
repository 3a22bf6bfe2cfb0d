"""Probes of a live SGLang server for a fidelity run (:mod:`topas.fidelity.run`).

* :func:`speed_probe`: the server's current speed relative to the profile, with which the
  calibrated simulation rescales the profile (CPU timings drift with the machine's load).
* :func:`scheduler_seconds`: SGLang's cumulative scheduler time by loop stage, read before and
  after a measured run.
"""

from __future__ import annotations

import re
import statistics
import urllib.request
from typing import TYPE_CHECKING, Callable

from topas.fidelity.profile_server import ServerClient, _Ids

if TYPE_CHECKING:  # pragma: no cover
    from topas.engine.cost import CostModel

__all__ = ["PROBE_PREFIX", "PROBE_NEW", "PROBE_OUT", "speed_probe", "scheduler_seconds"]


#: The speed probe's request: a cached prefix, a suffix and an output of the benchmark's sizes.
PROBE_PREFIX, PROBE_NEW, PROBE_OUT = 512, 64, 32


def speed_probe(server: str, cost: "CostModel", repeats: int = 4) -> Callable[[], float]:
    """A probe of the server's current speed relative to the profile: the median server-side
    latency of a request of ``PROBE_NEW`` new tokens on a cached ``PROBE_PREFIX``-token prefix
    with ``PROBE_OUT`` output tokens, minus the profile's fixed per-request path, over what the
    profile predicts for it (one prefill iteration and ``PROBE_OUT - 1`` decode steps, batch 1).
    CPU timings drift with the machine's load (other processes on 2 shared cores moved a decode
    step by 30% within minutes): the calibrated simulation rescales the profile by this factor,
    measured just before and just after each measured run."""
    client = ServerClient(server, timeout=120)
    ids = _Ids(12345)
    prefix, suffixes = ids.take(PROBE_PREFIX), [ids.take(PROBE_NEW) for _ in range(repeats)]
    req_s = float((cost.meta.get("overhead") or {}).get("request_s") or 0.0)
    predicted = (cost.prefill_time([(PROBE_NEW, PROBE_PREFIX)])
                 + cost.decode_steps_time(1, PROBE_PREFIX + PROBE_NEW + 1, PROBE_OUT - 1))

    def probe() -> float:
        client.generate(prefix, 1)
        lat = []
        for suf in suffixes:
            wall, meta = client.generate(prefix + suf, PROBE_OUT)
            e2e = meta.get("e2e_latency")
            lat.append(float(e2e) if isinstance(e2e, (int, float)) and e2e > 0 else wall)
        return max(statistics.median(lat) - req_s, 1e-6) / predicted

    return probe


def scheduler_seconds(server: str) -> dict[str, float] | None:
    """SGLang's cumulative scheduler time by loop stage (``sglang:scheduler_stage_seconds_total``
    in ``/metrics``, with ``--enable-metrics``): ``run_batch`` (the forward passes),
    ``get_next_batch_to_run`` (scheduling, the topas plugin included), ``process_batch_result``,
    ``recv_requests``, ``idle``, ...; ``None`` when the server exports no such metric."""
    try:
        with urllib.request.urlopen(server.rstrip("/") + "/metrics", timeout=30) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sglang:scheduler_stage_seconds_total{"):
            m = re.search(r'category="([^"]+)"', line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out or None
