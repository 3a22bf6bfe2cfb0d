"""The engine registry (docs/design.md "Layers"): engines register themselves by name, and an
experiment runs on whatever engine it names without the experiment layer knowing it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topas import engines, provenance
from topas.engine import registry
from topas.engine.registry import Engine, EngineRegistryError
from topas.experiments import Experiment, ExperimentError, run_experiment


def test_the_built_in_engines_register_under_their_names():
    assert engines.available_engines() == ("sim", "sglang")  # what an experiment may name
    assert set(engines.registered_engines()) == {"sim", "cluster", "sglang"}
    assert engines.get_engine("sim").cluster == "cluster" and engines.get_engine("sglang").cluster is None
    assert engines.get_engine("sim").options and not engines.get_engine("sglang").options
    assert engines.get_engine("sglang").in_process and not engines.get_engine("sim").in_process


def test_each_engine_declares_the_code_its_results_depend_on():
    for name in engines.available_engines():
        assert engines.get_engine(name).code == provenance.ENGINE_CODE[name]
    assert engines.get_engine("cluster").code == (*provenance.ENGINE_CODE["sim"], "cluster")


def test_an_unknown_engine_is_named_with_the_valid_ones():
    with pytest.raises(EngineRegistryError, match=r"unknown engine 'gpu'; valid engines: sim, sglang"):
        engines.get_engine("gpu")
    with pytest.raises(ExperimentError, match=r"unknown engine 'cluster'; valid engines: sim, sglang"):
        Experiment("dag-4", "fcfs", engine="cluster")  # reached through a router, not by name


def test_an_experiment_picks_its_runner_by_name():
    single = Experiment("dag-4", "fcfs", load=1.2, n_tasks=5)
    cluster = Experiment("dag-4", "fcfs", load=1.2, n_tasks=5, engines=2, router="round-robin")
    assert single.runner() is engines.get_engine("sim")
    assert cluster.runner() is engines.get_engine("cluster")


class _Echo(Engine):
    """A stand-in engine: the simulator's result, counted."""

    name = "echo"
    label = "the echo engine"
    code = provenance.CODE_PACKAGES
    runs: list[str] = []

    def key_entries(self, experiment):
        return {"echo": experiment.policy}

    def run(self, prepared, progress=False):
        self.runs.append(prepared.experiment.label())
        return engines.get_engine("sim").run(prepared, progress)


def test_a_registered_engine_runs_experiments_the_experiment_layer_never_named(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())
    registry.register(_Echo())
    e = Experiment("dag-4", "fcfs", load=1.2, n_tasks=5, engine="echo")
    assert e.canonical()["echo"] == "fcfs" and e.canonical()["engine"] == "echo"
    sim = Experiment("dag-4", "fcfs", load=1.2, n_tasks=5)
    assert e.key() != sim.key()
    assert run_experiment(e).deterministic_summary() == run_experiment(sim).deterministic_summary()
    assert _Echo.runs == [e.label()]
    with pytest.raises(ExperimentError, match="runs on the simulator only, not engine 'echo'"):
        Experiment("dag-4", "fcfs", engine="echo", engines=2, router="round-robin")
    with pytest.raises(ExperimentError, match="apply to the simulator only, not engine 'echo'"):
        Experiment("dag-4", "fcfs", engine="echo", engine_options={"host_tier": True})


def test_a_second_engine_of_a_taken_name_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())

    class Other(Engine):
        name = "sim"

    with pytest.raises(EngineRegistryError, match="engine 'sim' is already registered"):
        registry.register(Other())


def test_registering_the_engines_imports_neither_sglang_nor_aiohttp():
    code = ("import sys, topas.engines, topas.experiments; "
            "bad = [m for m in ('sglang', 'aiohttp') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
