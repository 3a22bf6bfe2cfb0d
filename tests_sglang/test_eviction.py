"""Eviction on the real CPU server: stock SGLang (fcfs) with ``--radix-eviction-policy priority``
and the replay sending each request's ``priority`` from the ``reuse`` rule
(:mod:`topas.sglang.priority`), on the contention case ``evict-freq`` (one call at a time, so
timing does not move the result): agent a's prefix, whose first calls foresee its later one,
outlives b's when c's call needs room, so a's last call hits (under lru it misses: a's prefix is
the oldest); the simulator with the same eviction and rule must give every request the server's
``cached_tokens``. One server, one run (plus a discarded warm-up), about 30 s.

Run by ``make test-sglang`` inside ``.venvs/sglang-cpu``; not collected by ``make test``.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("sglang")

from topas.engine.config import EngineConfig  # noqa: E402
from topas.experiments.spec import Prepared  # noqa: E402
from topas.fidelity.contention.cases import CASES, case_trace  # noqa: E402
from topas.fidelity.cpu_server import cpu_server  # noqa: E402
from topas.fidelity.run import server_kv_settings, sim_engine  # noqa: E402
from topas.fidelity.server_eviction import eviction_config_kw  # noqa: E402
from topas.paths import REPO_ROOT  # noqa: E402
from topas.policies.base import make_policy  # noqa: E402
from topas.sglang.priority import apply_rule  # noqa: E402
from topas.sglang.replay import run_replay  # noqa: E402

PROFILE = REPO_ROOT / "data" / "profiles" / "cpu_tiny-llama.json"

if "eviction" not in {f.name for f in dataclasses.fields(EngineConfig)}:  # pragma: no cover
    pytest.skip("this simulator has no EngineConfig.eviction", allow_module_level=True)


def test_priority_eviction_with_reuse_priorities(tmp_path):
    case = CASES["evict-freq"]
    trace = case_trace(case)
    trace = dataclasses.replace(trace, tasks=trace.tasks[:1])  # one chain: a a b c a
    with cpu_server(log_path=tmp_path / "server.log", max_total_tokens=case.pool_tokens, plugin=False,
                    schedule_policy="fcfs", eviction="priority") as url:
        settings = server_kv_settings(url)
        assert settings["radix_eviction_policy"] == "priority"
        prepared = Prepared(experiment=None, trace=trace, trace_path=None, rate=None, nominal_rate=None,
                            policy=make_policy("fcfs", {}), cost=None, config=EngineConfig())
        run_replay(prepared, url, handshake=False, eviction_priority="reuse")  # warm-up
        res = run_replay(prepared, url, handshake=False, eviction_priority="reuse")
    got = res.requests.set_index("stage_id")
    assert got["eviction_priority"].tolist() == [2, 1, 0, 0, 0]
    server = got["cached_tokens"].astype(int).tolist()
    assert server == [0, 1024, 0, 0, 1024], f"the server's cached tokens: {server}"

    from topas.engine.simulator import simulate

    cost, config = sim_engine(PROFILE, settings=settings)
    assert config.eviction.startswith("priority")
    sim = simulate(trace, apply_rule(make_policy("fcfs", {}), "reuse"), cost, config)
    simulated = sim.requests.set_index("stage_id").loc[got.index, "cached_tokens"].astype(int).tolist()
    assert simulated == server, f"simulated {simulated} vs the server's {server}"
    assert eviction_config_kw("priority") == {"eviction": "priority"}
