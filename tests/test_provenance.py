"""Code in the key: an edit to the engine, policy or workload code gives new keys, so a sweep
re-runs instead of serving the result of the old code; results record their environment."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from topas import provenance
from topas.experiments import Experiment
from topas.paths import REPO_ROOT, data_dir


def _copy_package(dst):
    shutil.copytree(REPO_ROOT / "topas", dst / "topas", ignore=shutil.ignore_patterns("__pycache__"))
    return dst / "topas"


def test_fingerprint_follows_every_byte_of_the_code(tmp_path):
    pkg = _copy_package(tmp_path)
    fp = provenance.code_fingerprint(provenance.CODE_PACKAGES, pkg)
    assert fp == provenance.code_fingerprint(provenance.CODE_PACKAGES, REPO_ROOT / "topas")
    # a package outside the set (the CLI, the plots, the notebooks' helpers) is not part of it
    (pkg / "plots" / "style.py").write_text((pkg / "plots" / "style.py").read_text() + "\n# a comment\n")
    provenance.code_fingerprint.cache_clear()
    assert provenance.code_fingerprint(provenance.CODE_PACKAGES, pkg) == fp
    for edit in ("policies/fcfs.py", "engine/simulator.py", "workload/arrivals.py"):
        f = pkg / edit
        before = f.read_bytes()
        f.write_bytes(before + b"\n# a comment\n")
        provenance.code_fingerprint.cache_clear()
        assert provenance.code_fingerprint(provenance.CODE_PACKAGES, pkg) != fp, edit
        f.write_bytes(before)
    (pkg / "policies" / "new_policy.py").write_text("x = 1\n")  # a new file counts too
    provenance.code_fingerprint.cache_clear()
    assert provenance.code_fingerprint(provenance.CODE_PACKAGES, pkg) != fp
    with pytest.raises(ValueError, match="topas/nope"):
        provenance.code_fingerprint(("nope",), pkg)


def test_each_engine_keys_on_its_own_code(monkeypatch):
    from topas.experiments.spec import ENGINES

    # an sglang key also names its server (tests/test_sglang_server.py); a recorded identity stands in
    monkeypatch.delenv("TOPAS_SGLANG_URL", raising=False)
    monkeypatch.setenv("TOPAS_SGLANG_IDENTITY", '{"device": "test"}')

    assert set(provenance.ENGINE_CODE) == set(ENGINES)
    fps = {e: provenance.engine_fingerprint(e) for e in provenance.ENGINE_CODE}
    assert len(set(fps.values())) == len(ENGINES)
    assert Experiment("dag-4", "fcfs", load=1.2, n_tasks=5).canonical()["code"] == fps["sim"]
    assert Experiment("dag-4", "fcfs", load=1.2, n_tasks=5, engine="sglang").canonical()["code"] == fps["sglang"]


SWEEP = """
import json, sys
from topas.experiments import Experiment, ResultStore, run_sweep
store = ResultStore(sys.argv[1])
e = Experiment("dag-4", "fcfs", load=1.2, n_tasks=60)
before = len(store.keys())
df = run_sweep([e], store, jobs=1, progress=False)
print(json.dumps({"key": e.key(), "ran": len(store.keys()) - before, "jct": float(df["jct_mean"].iloc[0])}))
"""


def test_editing_a_policy_in_a_clone_reruns_the_sweep(tmp_path):
    """The issue's check: with FCFS edited to LIFO in a copy of the code, the next sweep runs
    again (new key) and its result is the edited policy's, not the stored one."""
    clone = tmp_path / "clone"
    pkg = _copy_package(clone)
    store = tmp_path / "store"

    def sweep() -> dict:
        env = {"PYTHONPATH": str(clone), "TOPAS_DATA": str(data_dir()), "PATH": "/usr/bin:/bin"}
        r = subprocess.run([sys.executable, "-c", SWEEP, str(store)], capture_output=True, text=True, env=env,
                           cwd=clone, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = sweep()
    assert first["ran"] == 1 and sweep() == {**first, "ran": 0}  # stored, then served from the store
    fcfs = pkg / "policies" / "fcfs.py"
    text = fcfs.read_text()
    assert "order = self._queue.current(view)\n" in text
    fcfs.write_text(text.replace("order = self._queue.current(view)\n", "order = self._queue.current(view)[::-1]\n"))
    lifo = sweep()
    assert lifo["ran"] == 1 and lifo["key"] != first["key"]
    assert lifo["jct"] != first["jct"]  # the edited policy's own result, not the stored FCFS one
