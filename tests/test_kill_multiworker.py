"""Killing a sweep that runs on several workers (issue 44): after SIGINT or SIGKILL of the
process running it, no worker outlives it, no finished result is lost, and the same sweep
resumes with only the missing runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

import topas.experiments.sweep as sweep_mod
from topas.experiments import Experiment
from topas.experiments.store import ResultStore, run_sweep
from topas.paths import REPO_ROOT

psutil = pytest.importorskip("psutil")

#: runs of 1.5 s each on 2 workers: ~9 s in all, so a loaded machine still signals the sweep while
#: most of it is left (it is signalled when the first result is stored)
N = 12
SWEEP = textwrap.dedent(
    f"""
    import signal, sys, time
    # Ctrl-C as in a terminal: a test runner's worker may start us with SIGINT ignored, and Python
    # then keeps it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import topas.experiments.sweep as st
    from topas.experiments import Experiment

    real = st.run_experiment
    def slow(e):
        time.sleep(1.5)
        return real(e)
    st.run_experiment = slow  # the workers are forked: they run it too
    exps = [Experiment("chain-3", "fcfs", load=1.0, seed=s, n_tasks=4) for s in range({N})]
    st.run_sweep(exps, st.ResultStore(sys.argv[1]), jobs=2, progress=False)
    """
)


def exps() -> list[Experiment]:
    return [Experiment("chain-3", "fcfs", load=1.0, seed=s, n_tasks=4) for s in range(N)]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_killed_multi_worker_sweep_leaves_no_orphans_loses_nothing_and_resumes(tmp_path, monkeypatch, sig):
    s = ResultStore(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(tmp_path)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 45
        workers: list[int] = []
        while not s.keys() or len(workers) < 2:
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the sweep started no workers or stored nothing"
            workers = [c.pid for c in psutil.Process(proc.pid).children()]
            time.sleep(0.02)
        proc.send_signal(sig)  # the parent only, not its process group
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in workers if alive(p)], "workers outlived the sweep"

    done_before = s.keys()
    assert 1 <= len(done_before) < N
    created = {k: s.meta(k)["created"] for k in done_before}
    runs: list[str] = []
    real = sweep_mod.run_experiment
    monkeypatch.setattr(sweep_mod, "run_experiment", lambda e: runs.append(e.key()) or real(e))
    df = run_sweep(exps(), s, jobs=1, progress=False)
    assert sorted(runs) == sorted(e.key() for e in exps() if e.key() not in done_before)  # only the missing
    assert list(df["key"]) == [e.key() for e in exps()] and df["jct_mean"].notna().all()
    assert {k: s.meta(k)["created"] for k in done_before} == created  # nothing finished was lost or redone
    assert not list(tmp_path.glob(".tmp-*"))  # killed writers' temp folders went with the next write
