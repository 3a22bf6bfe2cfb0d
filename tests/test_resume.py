"""Resume: `make reproduce` stopped in any phase and started again re-runs nothing that finished.

The reproduction has two phases: the results table (:func:`topas.experiments.run_many`) and the
notebooks (each a papermill run whose sweeps go through :func:`topas.experiments.run_sweep`).
Both read the results store first and store every run as it finishes; Ctrl-C ends the script with
one line saying what is kept and how to resume, and leaves no half-executed notebook behind.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest

import topas.experiments.store as store_mod
import topas.experiments.sweep as sweep_mod
from topas.experiments import Experiment, ResultStore, run_many
from studies import grid
from topas.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "reproduce.py"
TINY = ["--quick", "--tasks", "4", "--seeds", "1", "--jobs", "1", "--no-progress"]


def load_reproduce():
    spec = importlib.util.spec_from_file_location("reproduce_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def counted_runs(monkeypatch, tmp_path):
    """Every simulation this process runs is counted; the working store is a temporary folder."""
    monkeypatch.setenv(store_mod.STORE_ENV, str(tmp_path / "store"))
    monkeypatch.setenv(store_mod.USE_PACKS_ENV, "0")
    real = sweep_mod.run_experiment
    state = {"runs": 0, "interrupt_at": None}

    def run(exp):
        state["runs"] += 1
        if state["runs"] == state["interrupt_at"]:
            raise KeyboardInterrupt
        return real(exp)

    monkeypatch.setattr(sweep_mod, "run_experiment", run)
    return state


def test_run_many_reads_and_writes_the_store(counted_runs, tmp_path):
    exps = [Experiment("dag-4", p, load=1.2, n_tasks=4) for p in ("fcfs", "lpm", "topas")]
    first = run_many(exps, jobs=1, progress=False)
    assert counted_runs["runs"] == 3 and len(ResultStore(tmp_path / "store").keys()) == 3
    again = run_many(exps + exps[:1], jobs=1, progress=False)
    assert counted_runs["runs"] == 3  # all read from the store
    assert again[:3] == first and again[3] == first[0]
    assert run_many(exps[:1], jobs=1, progress=False, store=False)[0]["key"] == first[0]["key"]
    assert counted_runs["runs"] == 3  # store=False runs in the worker path, not through the store


def test_results_phase_interrupted_then_resumed(counted_runs, tmp_path, capsys):
    reproduce = load_reproduce()
    total = 3 * len(grid.swept_policies())  # every policy but those that decide eviction
    counted_runs["interrupt_at"] = 7
    argv = [*TINY, "--out-dir", str(tmp_path / "figs"), "--no-notebooks"]
    assert reproduce.cli(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted: 6 finished run(s) are kept in ")
    assert "run the same command again" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "figs" / "results_synthetic.csv").exists()

    counted_runs.update(runs=0, interrupt_at=None)
    assert reproduce.cli(argv) == 0
    assert counted_runs["runs"] == total - 6  # nothing finished ran again
    counted_runs["runs"] = 0
    assert reproduce.cli(argv) == 0 and counted_runs["runs"] == 0


def _sweep_notebook(path, policy: str, record) -> None:
    """A notebook that records how many of its experiments the store lacks, then sweeps them."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("quick = True\nout_dir = None", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "from topas.experiments import Experiment, ResultStore, run_sweep\n"
            f"exps = [Experiment('chain-3', {policy!r}, load=1.2, seed=s, n_tasks=4) for s in (5, 6)]\n"
            "missing = sum(not ResultStore().has(e) for e in exps)\n"
            f"open({str(record)!r}, 'a').write(f'{{missing}}\\n')\n"
            "run_sweep(exps, jobs=1, progress=False)"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_notebook_phase_interrupted_then_resumed(counted_runs, tmp_path, monkeypatch, capsys):
    import papermill as pm

    import pipeline.notebooks as nbmod

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    record = tmp_path / "missing.txt"
    _sweep_notebook(nbdir / "01_fcfs.ipynb", "fcfs", record)
    _sweep_notebook(nbdir / "02_lpm.ipynb", "lpm", record)
    monkeypatch.setattr(nbmod, "NOTEBOOKS_DIR", nbdir)
    real = pm.execute_notebook
    interrupt = {"on": "02_"}

    def execute(src, out, **kw):  # Ctrl-C while the second notebook runs
        if interrupt["on"] and interrupt["on"] in src:
            open(out, "w").write("{}")
            raise KeyboardInterrupt
        return real(src, out, **kw)

    monkeypatch.setattr(pm, "execute_notebook", execute)
    reproduce = load_reproduce()
    argv = [*TINY, "--out-dir", str(tmp_path / "figs")]
    assert reproduce.cli(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("interrupted: ")
    executed = nbdir / "executed" / "quick"
    assert sorted(p.name for p in executed.iterdir()) == ["01_fcfs.ipynb"]  # nothing half-executed
    assert record.read_text().split() == ["2"]

    runs_before = counted_runs["runs"]
    interrupt["on"] = None
    assert reproduce.cli(argv) == 0
    assert counted_runs["runs"] == runs_before  # the results table came from the store
    assert record.read_text().split() == ["2", "0", "2"]  # notebook 01 found its runs stored
    assert sorted(p.name for p in executed.iterdir()) == ["01_fcfs.ipynb", "02_lpm.ipynb"]


@pytest.mark.slow
def test_ctrl_c_on_the_real_script_prints_one_line(tmp_path):
    """A real SIGINT to the script's process group (as a terminal's Ctrl-C): one line, no traceback,
    worker processes stopped, and the finished runs stay in the store."""
    env = {**os.environ, store_mod.STORE_ENV: str(tmp_path / "store"), "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, str(SCRIPT), "--quick", "--tasks", "300", "--seeds", "1", "--jobs", "2",
           "--out-dir", str(tmp_path / "figs"), "--no-notebooks", "--no-progress"]
    p = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "store").glob("*/*/meta.json")):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted: ")
    kept = len(list((tmp_path / "store").glob("*/*/meta.json")))
    assert kept >= 1 and f"interrupted: {kept} finished run(s)" in lines[0]
