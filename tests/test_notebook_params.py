"""Every notebook checks its parameters in the cell after its ``parameters`` cell, and a bad
value stops it with one line that names the parameter and what is allowed.

The check cells run here in this process (the parameters cell, then the check cell), not in a
kernel: a bad value must be refused before the notebook runs anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from topas.experiments.notebook_params import (ParameterError, check_params, declared_parameters, each_of, one_of,
                                               positive)
from pipeline.notebooks import UnknownParameter, check_parameter_names
from topas.paths import REPO_ROOT

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: refused by every rule: not a flag, a path, a positive number, a name, a list or a dict
BAD = -1.5


def _cells(path: Path) -> tuple[str, str]:
    """The notebook's parameters cell and the cell right after it (the check)."""
    cells = nbformat.read(path, as_version=4).cells
    i = next(k for k, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    return cells[i].source, cells[i + 1].source


def _run_check(path: Path, **overrides) -> None:
    params, check = _cells(path)
    ns: dict = {}
    exec(params, ns)
    ns.update(overrides)  # what papermill's injected cell does
    exec(check, ns)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_cell_after_the_parameters_checks_them_and_the_defaults_pass(path):
    assert "check_params(globals()" in _cells(path)[1], f"{path.name}: the cell after 'parameters' checks them"
    _run_check(path)


@pytest.mark.parametrize("path,name", [(p, n) for p in NOTEBOOKS for n in declared_parameters(p)],
                         ids=lambda x: x.name if isinstance(x, Path) else x)
def test_a_bad_value_of_any_parameter_stops_with_one_line_naming_it(path, name):
    with pytest.raises(ParameterError) as e:
        _run_check(path, **{name: BAD})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"parameter {name}={BAD!r} is not allowed: ")
    assert e.value._render_traceback_() == [f"ParameterError: {msg}"]  # IPython shows this line, no traceback


def test_a_misspelt_workload_lists_the_traces():
    with pytest.raises(ParameterError, match=r"^parameter workload='dag4' is not allowed: one of .*\bdag-4\b"):
        _run_check(REPO_ROOT / "notebooks" / "09_weights_explorer.ipynb", workload="dag4")


def test_rules_name_what_they_allow():
    check_params({"w": ["a"], "x": 2}, w=each_of(["a", "b"]), x=positive)
    with pytest.raises(ParameterError, match=r"^parameter w=\['c'\] is not allowed: a list of a, b$"):
        check_params({"w": ["c"]}, w=each_of(["a", "b"]))
    with pytest.raises(ParameterError, match=r"^parameter p=\[\] is not allowed: one of a$"):
        check_params({"p": []}, p=one_of(["a"]))  # unhashable: refused, not a TypeError


def test_the_runner_refuses_a_parameter_the_notebook_does_not_declare():
    nb = REPO_ROOT / "notebooks" / "06_mechanism.ipynb"
    check_parameter_names(nb, {"quick": True, "out_dir": "x"})
    with pytest.raises(UnknownParameter, match=r"^06_mechanism.ipynb takes no parameter workload; its parameters: "
                                               r"workloads, policies, "):
        check_parameter_names(nb, {"workload": "dag-4", "quick": True})


def test_execute_notebooks_refuses_a_misspelt_parameter_before_running_anything(tmp_path):
    from pipeline.notebooks import execute_notebooks

    nb = REPO_ROOT / "notebooks" / "02_synthetic_jct.ipynb"
    with pytest.raises(UnknownParameter, match=r"takes no parameter workload;"):
        execute_notebooks({"workload": ["dag-4"], "quick": True}, [nb], executed_dir=tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()  # nothing ran, nothing was written
