"""Every notebook in notebooks/ runs in quick mode under papermill and writes the files it declares.

``EXPECTED`` lists, per notebook, every figure and table file it writes into ``out_dir``. A
notebook that is not listed fails, so a new notebook must declare its outputs here; a notebook
that writes a file it did not declare fails too (so every output is checked).

The kernel: notebooks name the ``python3`` kernelspec. jupyter_client starts that spec (whose
command is ``python -m ipykernel_launcher``) with the interpreter running papermill, i.e. the
venv's python under ``make test``; ``test_kernel_is_this_python`` checks that, so a notebook
never silently runs against another installation of topas.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pipeline.notebooks import KERNEL_ARGS
from topas.paths import REPO_ROOT

papermill = pytest.importorskip("papermill")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))

#: notebook -> the files it writes into ``out_dir`` (figures: .png + .pdf; tables: .csv + .md).
EXPECTED: dict[str, list[str]] = {
    "01_workloads.ipynb": ["workloads_dags.png", "workloads_dags.pdf", "workloads_sizes.csv", "workloads_sizes.md"],
    "02_synthetic_jct.ipynb": [
        "synthetic_jct_vs_load.png", "synthetic_jct_vs_load.pdf",
        "synthetic_throughput.png", "synthetic_throughput.pdf",
        "synthetic_jct_table.csv", "synthetic_jct_table.md",
    ],
    # The MetaGPT traces are in data/traces/ (issue 5): the status table plus the figures and table.
    "03_metagpt.ipynb": [
        "metagpt_status.csv", "metagpt_status.md", "metagpt_jct_vs_load.png", "metagpt_jct_vs_load.pdf",
        "metagpt_throughput.png", "metagpt_throughput.pdf", "metagpt_jct_table.csv", "metagpt_jct_table.md",
        "metagpt_cache_runs.csv", "metagpt_cache_runs.md", "metagpt_cache_verdict.csv", "metagpt_cache_verdict.md",
    ],
    "04_ablations.ipynb": ["ablations_dag4.png", "ablations_dag4.pdf", "ablations_metagpttl.png", "ablations_metagpttl.pdf",
                           "ablations_table.csv", "ablations_table.md"],
    "05_overhead.ipynb": [
        "overhead_decision_time.png", "overhead_decision_time.pdf", "overhead_table.csv", "overhead_table.md",
    ],
    "06_mechanism.ipynb": [
        "mechanism_kv_occupancy.png", "mechanism_kv_occupancy.pdf",
        "mechanism_queueing.png", "mechanism_queueing.pdf",
        "mechanism_table.csv", "mechanism_table.md",
        "mechanism_case.png", "mechanism_case.pdf", "mechanism_case_kv.png", "mechanism_case_kv.pdf",
        *(f"{n}.{ext}" for n in ("plan_execution_table", "plan_terms_table", "mechanism_case_table")
          for ext in ("csv", "md")),
    ],
    "07_sensitivity.ipynb": [
        "sensitivity_beta_rho.png", "sensitivity_beta_rho.pdf",
        "sensitivity_rho_hage.png", "sensitivity_rho_hage.pdf",
        "sensitivity_table.csv", "sensitivity_table.md",
    ],
    "08_paper_vs_ours.ipynb": ["paper_vs_ours.png", "paper_vs_ours.pdf", "paper_vs_ours.csv", "paper_vs_ours.md"],
    "09_weights_explorer.ipynb": ["weights_explorer.png", "weights_explorer.pdf"],
    # renders the committed comparison in data/results/fidelity/ (no server needed)
    "10_fidelity.ipynb": ["fidelity_sim_vs_measured.png", "fidelity_sim_vs_measured.pdf",
                          "fidelity_table.csv", "fidelity_table.md", "fidelity_noise.csv", "fidelity_noise.md",
                          "fidelity_path.csv", "fidelity_path.md", "fidelity_contention.csv", "fidelity_contention.md",
                          "fidelity_contention_arrivals.csv", "fidelity_contention_arrivals.md",
                          "fidelity_contention_current.csv", "fidelity_contention_current.md"],
    "11_engine_model.ipynb": ["engine_model.png", "engine_model.pdf", "engine_model_table.csv", "engine_model_table.md",
                              "engine_model_shift.csv", "engine_model_shift.md"],
    "12_when_claims_hold.ipynb": [
        *(f"{n}.{ext}" for n in ("capacity_jct_vs_load", "headroom", "reading_space") for ext in ("png", "pdf")),
        *(f"{n}.{ext}" for n in ("capacity_search_table", "operating_points_table", "headroom_table", "reading_space_table",
                                 "reading_space_spread", "topas_plus_table", "topas_plus_selection",
                                 "claims_ablations_table", "readings_verdict_table") for ext in ("csv", "md")),
    ],
    "13_several_engines.ipynb": [
        *(f"{n}.{ext}" for n in ("cluster_jct_vs_load_dag-4", "cluster_balance", "cluster_scaling")
          for ext in ("png", "pdf")),
        *(f"{n}.{ext}" for n in ("cluster_runs_table", "cluster_best_table", "cluster_router_table",
                                 "cluster_scaling_table") for ext in ("csv", "md")),
    ],
    "14_robustness.ipynb": [
        *(f"robustness_{n}.{ext}" for n in ("noise", "bias", "dag", "arrivals", "estimator") for ext in ("png", "pdf")),
        *(f"robustness_{n}.{ext}" for n in ("table", "verdict", "stability", "estimator_table") for ext in ("csv", "md")),
    ],
    "15_eviction.ipynb": ["eviction_belady_gap.png", "eviction_belady_gap.pdf",
                          *(f"eviction_{n}.{ext}" for n in ("runs", "seeds", "gap", "matters", "screen_verdict", "verdict",
                                                               "full_cells", "full_runs", "full_seeds", "full_gap",
                                                               "full_matters") for ext in ("csv", "md"))],
    "16_protocol.ipynb": [
        *(f"protocol_{n}.{ext}" for n in ("capacity", "verdicts") for ext in ("png", "pdf")),
        *(f"{n}.{ext}" for n in ("capacity_table", "verdict_table", "overload_table", "convergence_table",
                                 "protocol_runs", "capacity_table_guarded", "verdict_table_guarded")
          for ext in ("csv", "md")),
    ],
}

KERNEL = "python3"


def _execute(src: Path, out: Path, parameters: dict, cwd: Path) -> None:
    papermill.execute_notebook(
        str(src),
        str(out),
        parameters=parameters,
        kernel_name=KERNEL,
        cwd=str(cwd),
        progress_bar=False,
        log_output=False,
        extra_arguments=KERNEL_ARGS,  # as the runner starts them: headless
    )


def test_every_declared_notebook_exists():
    missing = sorted(set(EXPECTED) - set(NOTEBOOKS))
    assert not missing, f"EXPECTED lists notebooks that are not in notebooks/: {missing}"


def test_notebooks_are_numbered_in_reading_order():
    nums = []
    for name in NOTEBOOKS:
        m = re.fullmatch(r"(\d\d)_[a-z0-9_]+\.ipynb", name)
        assert m, f"{name}: notebooks are named NN_topic.ipynb (two digits, lower case)"
        nums.append(m.group(1))
    assert len(nums) == len(set(nums)), f"two notebooks share a number: {NOTEBOOKS}"


def _as_git_holds_it(name: str):
    """The notebook as git holds it (the index: what a commit takes, through `make lab`'s
    nbstripout filter), else the file: outputs that Lab saved on disk are not committed."""
    import subprocess

    try:
        text = subprocess.run(["git", "show", f":notebooks/{name}"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    return nbformat.reads(text, as_version=4)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_clean_with_parameters(name):
    nb = _as_git_holds_it(name)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{name}: needs exactly one cell tagged 'parameters' (papermill)"
    for var in ("quick", "out_dir"):
        assert re.search(rf"^{var}\s*=", params[0].source, re.M), f"{name}: parameters cell lacks {var!r}"
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs and c.execution_count is None, f"{name}: commit it with outputs cleared"


def _parameter_names(name: str) -> set[str]:
    import ast

    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def _readme_parameters() -> dict[str, set[str]]:
    """notebook -> the parameters notebooks/README.md's table says it takes."""
    text = (NOTEBOOKS_DIR / "README.md").read_text()
    table = text.split("| parameter | notebooks | meaning |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, set[str]] = {n: set() for n in NOTEBOOKS}
    for row in table.strip().splitlines()[1:]:
        cols = [c.strip() for c in row.strip("|").split("|")]
        params = re.findall(r"`([A-Za-z_]+)`", cols[0])
        numbers: set[int] = set()
        for part in cols[1].split(","):
            lo, _, hi = part.strip().partition("-")
            numbers.update(range(int(lo), int(hi or lo) + 1))
        for n in NOTEBOOKS:
            if int(n[:2]) in numbers:
                out[n].update(params)
    return out


def test_readme_lists_exactly_each_notebooks_parameters():
    """notebooks/README.md's parameter table matches every notebook's parameters cell (papermill
    warns about a parameter a notebook does not take)."""
    listed = _readme_parameters()
    for name in NOTEBOOKS:
        assert listed[name] == _parameter_names(name), (
            f"{name}: README lists {sorted(listed[name] - _parameter_names(name))} it does not take, "
            f"omits {sorted(_parameter_names(name) - listed[name])}")


@pytest.mark.slow  # 15-60 s each: deselect with -m 'not slow'
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_quick_and_writes_its_outputs(name, tmp_path, monkeypatch):
    assert name in EXPECTED, (
        f"{name} is not in tests/test_notebooks.py EXPECTED: declare the figure/table files it writes"
    )
    figs = tmp_path / "figures"
    # anything written without out_dir lands here too, never in the repository's figures/
    monkeypatch.setenv("TOPAS_FIGURES", str(figs))
    # pytest-xdist already runs a test on each core: the notebook's sweeps run in its kernel,
    # not on worker processes of their own that would each load the simulator again
    monkeypatch.setenv("TOPAS_JOBS", "1")
    params = {"quick": True, "out_dir": str(figs)}
    if "store_dir" in _parameter_names(name):  # (papermill warns of a parameter a notebook does not take)
        # quick results go to a temporary store, never the repository's data/results/store
        params["store_dir"] = str(tmp_path / "store")
    _execute(NOTEBOOKS_DIR / name, tmp_path / name, params, NOTEBOOKS_DIR)
    for f in EXPECTED[name]:
        p = figs / f
        assert p.is_file(), f"{name} did not write {f}"
        assert p.stat().st_size > 0, f"{name} wrote an empty {f}"
    written = sorted(p.name for p in figs.iterdir()) if figs.exists() else []
    extra = sorted(set(written) - set(EXPECTED[name]))
    assert not extra, f"{name} wrote files not declared in EXPECTED: {extra}"


def test_kernel_is_this_python(tmp_path):
    """The 'python3' kernel papermill starts is this interpreter (the venv's), not another one."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("out = None", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("import sys, pathlib\npathlib.Path(out).write_text(sys.prefix + '\\n' + sys.executable)"),
    ]
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    src = tmp_path / "probe.ipynb"
    nbformat.write(nb, src)
    res = tmp_path / "prefix.txt"
    _execute(src, tmp_path / "probe_out.ipynb", {"out": str(res)}, tmp_path)
    prefix, executable = res.read_text().splitlines()
    assert prefix == sys.prefix, f"kernel runs {executable}, tests run {sys.executable}"
