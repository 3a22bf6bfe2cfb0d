"""Shared test fixtures: a small cost model with round coefficients and tiny trace builders.

The cost model ``ROUND_COST`` has round numbers so a reader can redo any expected time by hand:

* prefill iteration over chunks ``[(n, c), ...]``: ``0.01 + 1e-4 * sum(n) + sum(1e-7*n*c + 1e-7*n*n)``;
* decode step of ``b`` requests holding ``T`` context tokens: ``0.02 + 1e-3 * b + 1e-6 * T``;
* prefix swap of ``l`` tokens (either direction): ``0.001 + l * 1000 B / 1e6 B/s`` = ``0.001 + l/1000``;
* KV budget 100,000 tokens (tests shrink it with ``EngineConfig(kv_budget=...)``), chunked prefill
  at 4,096 tokens.

The builders keep test traces short: ``trace(agents, tasks)`` with ``agents`` a ``{name: l_a}``
mapping and ``tasks`` built by ``task(id, arrival, stage(...), ...)``. Request ids are
``"<task id>/<stage id>"``, as in the engine.

Test modules import these helpers with ``from conftest import ...`` (pytest puts this directory
on ``sys.path``); fixtures of the same names are provided for tests that prefer injection.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Mapping

import pytest
from click.testing import CliRunner

import topas.experiments.sweep as sweep_mod
from topas.cli import main as cli_main
from topas.engine.cost import CostModel
from topas.workload.model import Agent, Stage, Task, Trace

ROUND_COST = CostModel(
    name="test-round",
    kv_budget_tokens=100_000,
    kv_bytes_per_token=1000.0,
    swap_bandwidth=1e6,
    swap_latency=0.001,
    prefill_c0=0.01,
    prefill_c_new=1e-4,
    prefill_c_new_cached=1e-7,
    prefill_c_new_sq=1e-7,
    decode_c0=0.02,
    decode_c_batch=1e-3,
    decode_c_kv=1e-6,
    max_prefill_tokens=4096,
)

#: Every agent's output prior in these traces: deliberately *not* any stage's true output length,
#: so a test can tell the prior (visible to policies) from the truth (never visible).
PRIOR_OUTPUT = 12345.0


def stage(id: str, agent: str, x: int, y: int, parents: tuple[str, ...] | str = ()) -> Stage:
    """Stage ``id`` of ``agent`` with ``x`` suffix input and ``y`` true output tokens."""
    if isinstance(parents, str):
        parents = tuple(parents)  # "AB" -> ("A", "B")
    return Stage(id=id, agent=agent, input_tokens=x, output_tokens=y, parents=tuple(parents))


def task(id: str, arrival: float, *stages: Stage, workflow: str = "test") -> Task:
    return Task(id=id, arrival=float(arrival), stages=tuple(stages), workflow=workflow)


def trace(agents: Mapping[str, int], tasks: list[Task] | tuple[Task, ...], name: str = "test") -> Trace:
    """A trace from ``{agent name: prefix tokens l_a}`` and tasks (sorted by arrival by the caller)."""
    return Trace(
        name=name,
        agents={a: Agent(name=a, prefix_tokens=l, expected_output_tokens=PRIOR_OUTPUT)
                for a, l in agents.items()},
        tasks=tuple(tasks),
    )


def chain3_task(id: str, arrival: float, x: Mapping[str, int], y: Mapping[str, int]) -> Task:
    """Chain-3 A -> B -> C; stage s uses agent s."""
    return task(id, arrival, stage("A", "A", x["A"], y["A"]), stage("B", "B", x["B"], y["B"], "A"),
                stage("C", "C", x["C"], y["C"], "B"), workflow="chain-3")


def dag4_task(id: str, arrival: float, x: Mapping[str, int], y: Mapping[str, int]) -> Task:
    """DAG-4 A -> {B, C} -> D; stage s uses agent s."""
    return task(id, arrival, stage("A", "A", x["A"], y["A"]), stage("B", "B", x["B"], y["B"], "A"),
                stage("C", "C", x["C"], y["C"], "A"), stage("D", "D", x["D"], y["D"], "BC"), workflow="dag-4")


def summary_only_pack(store_root: Path, keys: Iterable[str], dest: Path) -> Path:
    """A results pack at ``dest`` holding the results of ``keys`` from the store at ``store_root``
    as ``make pack`` ships a summary-only run: each ``meta.json``, no table, and a manifest that
    says so."""
    keys = list(keys)
    shutil.copytree(store_root, dest)
    for key in keys:
        for t in (dest / key[:2] / key).glob("*.parquet"):
            t.unlink()
    (dest / "manifest.json").write_text(json.dumps({"experiments": [{"key": k, "tables": []} for k in keys]}))
    return dest


@pytest.fixture(scope="session")
def cost() -> CostModel:
    return ROUND_COST


def good_trace_dict() -> dict:
    """A valid two-task DAG-4-like trace in the file format (schema topas.trace/1)."""

    def stages():
        return [
            {"id": "A", "agent": "a", "input_tokens": 10, "output_tokens": 5, "parents": []},
            {"id": "B", "agent": "b", "input_tokens": 20, "output_tokens": 5, "parents": ["A"]},
            {"id": "C", "agent": "b", "input_tokens": 30, "output_tokens": 5, "parents": ["A"]},
            {"id": "D", "agent": "a", "input_tokens": 40, "output_tokens": 5, "parents": ["B", "C"]},
        ]

    return {
        "schema": "topas.trace/1",
        "name": "tiny",
        "meta": {"description": "test"},
        "agents": [
            {"name": "a", "prefix_tokens": 100, "expected_output_tokens": 5.0},
            {"name": "b", "prefix_tokens": 200, "expected_output_tokens": 5},
        ],
        "tasks": [
            {"id": "t00000", "arrival": 0.0, "workflow": "tiny", "stages": stages()},
            {"id": "t00001", "arrival": 1.5, "workflow": "tiny", "stages": stages()},
        ],
    }


def good_trace_v2_dict() -> dict:
    """A valid topas.trace/2 trace: two tasks whose prompts share segments (the worked example of
    tests/test_reuse.py).

    ``P`` is agent a's prefix (4 tokens), ``H`` a header both tasks' a-calls hold after it (2),
    ``C`` task t00000's context (5) that its stages A and B both hold, then each call's unique part;
    t00001/B is agent b's call: its prefix ``Pb`` (3) and 2 tokens of its own."""
    seg = [
        {"id": "P", "tokens": 4, "kind": "prefix"},
        {"id": "H", "tokens": 2, "kind": "shared"},
        {"id": "C", "tokens": 5, "kind": "context", "task": "t00000", "origin": "A"},
        {"id": "U0", "tokens": 3, "kind": "unique", "task": "t00000", "origin": "A"},
        {"id": "U1", "tokens": 6, "kind": "unique", "task": "t00000", "origin": "B"},
        {"id": "V", "tokens": 7, "kind": "unique", "task": "t00001", "origin": "A"},
        {"id": "Pb", "tokens": 3, "kind": "prefix"},
        {"id": "W", "tokens": 2, "kind": "unique", "task": "t00001", "origin": "B"},
    ]
    return {
        "schema": "topas.trace/2",
        "name": "tiny2",
        "meta": {"description": "test"},
        "agents": [
            {"name": "a", "prefix_tokens": 4, "expected_output_tokens": 5.0},
            {"name": "b", "prefix_tokens": 3, "expected_output_tokens": 5.0},
        ],
        "tasks": [
            {"id": "t00000", "arrival": 0.0, "workflow": "tiny2", "stages": [
                {"id": "A", "agent": "a", "input_tokens": 10, "output_tokens": 5, "parents": [],
                 "segments": ["P", "H", "C", "U0"]},
                {"id": "B", "agent": "a", "input_tokens": 13, "output_tokens": 5, "parents": ["A"],
                 "segments": ["P", "H", "C", "U1"]},
            ]},
            {"id": "t00001", "arrival": 1.0, "workflow": "tiny2", "stages": [
                {"id": "A", "agent": "a", "input_tokens": 9, "output_tokens": 5, "parents": [],
                 "segments": ["P", "H", "V"]},
                {"id": "B", "agent": "b", "input_tokens": 2, "output_tokens": 5, "parents": ["A"],
                 "segments": ["Pb", "W"]},
            ]},
        ],
        "segments": seg,
    }


def task_view(tid: str, stages: list[tuple[str, str, tuple[str, ...]]], done: tuple[str, ...] = (),
              complete: bool = True):
    """A policy's :class:`topas.engine.view.TaskView` of a task from (stage, agent, parents) in
    topological order (10 input tokens each); ``complete=False``: only these stages are shown."""
    from topas.engine.view import StageView, TaskView

    kids: dict[str, list[str]] = {s: [] for s, _, _ in stages}
    for s, _, ps in stages:
        for p in ps:
            kids[p].append(s)
    sv = {s: StageView(s, a, 10, ps, tuple(kids[s])) for s, a, ps in stages}
    return TaskView(tid, 0.0, "w", sv, tuple(s for s, _, _ in stages), frozenset(done), {}, complete=complete)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that does not log each request to stderr."""

    def log_message(self, *args) -> None:
        pass


class LocalHTTPServer:
    """``handler`` (a :class:`QuietHandler` subclass) served on a free local port in a daemon
    thread at :attr:`url` until :meth:`close`: the fake servers of the client tests."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


#: The file the controller's background load of TOPAS's compiled search writes once it is done
#: (set for the test processes it starts: pytest-xdist's workers inherit it).
KERNEL_READY_ENV = "TOPAS_TEST_KERNEL_READY"
#: How long a test waits for it before it loads the kernel itself (seconds).
KERNEL_WAIT_S = 300


def kept_view(view):
    """``view`` as a recording keeps it past the decision: with its running requests copied (the
    simulator builds them at their first read and seals them once the policy has decided)."""
    return dataclasses.replace(view, running=tuple(view.running))


def pytest_configure(config):
    """TOPAS's compiled search is loaded once, in a background process started before any test
    runs: where numba has not cached it yet (a fresh clone), compiling it takes about half a
    minute, and every process that reached it first would compile it at once. The tests that
    do not run it go on meanwhile; a test process that loads it (``topas_search_compiled.load``),
    and a test marked ``search_kernel`` (it starts processes that load it), first waits for the
    background load to finish, then loads it from numba's cache in under a second."""
    config.addinivalue_line("markers", "search_kernel: starts processes that run TOPAS's compiled search "
                                       "(waits for the session's background compilation of it)")
    if not os.environ.get(KERNEL_READY_ENV) and not hasattr(config, "workerinput"):
        ready = Path(tempfile.mkdtemp(prefix="topas-test-kernel-")) / "ready"
        os.environ[KERNEL_READY_ENV] = str(ready)
        code = ("import pathlib\ntry:\n    from topas.policies import topas_search_compiled\n"
                "    topas_search_compiled.load()\nfinally:\n"
                f"    pathlib.Path({str(ready)!r}).write_text('done')\n")
        config._topas_kernel_load = subprocess.Popen([sys.executable, "-c", code])
    from topas.policies import topas_search_compiled

    load = topas_search_compiled.load

    def load_when_ready():
        wait_for_search_kernel()
        return load()

    topas_search_compiled.load = load_when_ready


def pytest_unconfigure(config):
    proc = getattr(config, "_topas_kernel_load", None)
    if proc is not None:
        proc.wait()


def wait_for_search_kernel() -> None:
    """Wait (at most :data:`KERNEL_WAIT_S`) until the session's background load of the compiled
    search is done (:func:`pytest_configure`)."""
    ready = os.environ.get(KERNEL_READY_ENV)
    deadline = time.monotonic() + KERNEL_WAIT_S
    while ready and not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.1)


def pytest_runtest_setup(item):
    if item.get_closest_marker("search_kernel") is not None:
        wait_for_search_kernel()


def pytest_collection_modifyitems(config, items):
    """The slow tests first (stable otherwise): under pytest-xdist's work stealing the long ones
    then start while the short ones fill the gaps, so no worker ends on a minute-long notebook."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def make_runner() -> CliRunner:
    """A runner of the ``topas`` command line that keeps stderr apart from stdout (click 8.1 mixes
    them unless told not to; 8.2+ always keeps them apart)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


@pytest.fixture
def runner() -> CliRunner:
    """:func:`make_runner`'s runner, one per test."""
    return make_runner()


def run_cli(runner: CliRunner, *args):
    """``topas ARGS...`` in this process (each argument as a string)."""
    return runner.invoke(cli_main, [str(a) for a in args])


@pytest.fixture
def counted(monkeypatch) -> list[str]:
    """The keys of the experiments run in this process from now on, in order (sweeps with
    ``jobs=1`` run here)."""
    runs: list[str] = []
    real = sweep_mod.run_experiment

    def counting(e):
        runs.append(e.key())
        return real(e)

    monkeypatch.setattr(sweep_mod, "run_experiment", counting)
    return runs


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """Each test leaves the process's environment as it found it: a command run in-process (the
    reproduce script's ``cli``, which sets variables for its notebooks' kernels) does not reach
    the tests after it in the same worker."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
