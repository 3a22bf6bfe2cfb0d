"""The notebook runner behind `make reproduce`: reading order, executed copies, failures named."""

from __future__ import annotations

import nbformat
import pytest

from pipeline.notebooks import NotebookFailed, children_cpu, execute_notebooks, notebook_paths


def _nb(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("out = None", metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_numbered_notebooks_in_reading_order(tmp_path):
    for name in ("02_b.ipynb", "01_a.ipynb", "10_c.ipynb", "scratch.ipynb"):
        _nb(tmp_path / name)
    assert [p.name for p in notebook_paths(tmp_path)] == ["01_a.ipynb", "02_b.ipynb", "10_c.ipynb"]


def test_runs_each_with_the_parameters_and_keeps_executed_copies(tmp_path):
    nb = _nb(tmp_path / "01_a.ipynb", "import pathlib\npathlib.Path(out).write_text('ran')")
    target = tmp_path / "marker.txt"
    done = execute_notebooks({"out": str(target)}, [nb], tmp_path / "executed", progress=False)
    assert target.read_text() == "ran"
    assert [p.name for p in done] == ["01_a.ipynb"] and done[0].is_file()


def test_each_notebook_reports_its_wall_time_and_the_cpu_its_kernel_and_workers_spent(tmp_path, capsys):
    burn = ("from concurrent.futures import ProcessPoolExecutor\n"
            "with ProcessPoolExecutor(1) as pool:\n"
            "    pool.submit(sum, range(6 * 10**7)).result()")
    idle, busy = _nb(tmp_path / "01_idle.ipynb", "x = 1"), _nb(tmp_path / "02_burn.ipynb", burn)
    spent = []
    for nb in (idle, busy):
        before = children_cpu()
        execute_notebooks({"out": None}, [nb], tmp_path / "executed", progress=False)
        spent.append(children_cpu() - before)
    lines = [x for x in capsys.readouterr().out.splitlines() if " done in " in x]
    assert len(lines) == 2 and all("CPU s:" in x and "cores busy" in x for x in lines)
    # the worker's ~1 s sum is counted: its CPU time is a (grand)child's once the kernel has exited
    assert spent[1] - spent[0] >= 0.5


def test_a_failure_names_the_notebook_and_the_cell(tmp_path):
    ok = _nb(tmp_path / "01_ok.ipynb", "x = 1")
    bad = _nb(tmp_path / "02_bad.ipynb", "y = 2", "raise ValueError('no results for dag-4')")
    later = _nb(tmp_path / "03_later.ipynb", "import pathlib\npathlib.Path(out).write_text('ran')")
    marker = tmp_path / "later.txt"
    with pytest.raises(NotebookFailed) as err:
        execute_notebooks({"out": str(marker)}, [ok, bad, later], tmp_path / "executed", progress=False)
    msg = str(err.value)
    assert "02_bad.ipynb" in msg and "ValueError: no results for dag-4" in msg and "cell" in msg
    assert not marker.exists()  # the run stopped at the failure
    assert (tmp_path / "executed" / "02_bad.failed.ipynb").is_file()  # kept for inspection
    assert not (tmp_path / "executed" / "02_bad.ipynb").exists()  # never under its own name
    assert sorted(p.name for p in (tmp_path / "executed").iterdir()) == ["01_ok.ipynb", "02_bad.failed.ipynb"]


def test_an_interrupted_notebook_leaves_no_executed_copy(tmp_path, monkeypatch):
    """Ctrl-C while a notebook runs: the copy being written is removed, the finished ones stay."""
    import papermill as pm

    first = _nb(tmp_path / "01_first.ipynb", "x = 1")
    second = _nb(tmp_path / "02_second.ipynb", "x = 2")
    real = pm.execute_notebook

    def execute(src, out, **kw):
        if "02_" in src:
            with open(out, "w") as f:  # papermill writes its output as it goes
                f.write("{}")
            raise KeyboardInterrupt
        return real(src, out, **kw)

    monkeypatch.setattr(pm, "execute_notebook", execute)
    with pytest.raises(KeyboardInterrupt):
        execute_notebooks({}, [first, second], tmp_path / "executed", progress=False)
    assert [p.name for p in (tmp_path / "executed").iterdir()] == ["01_first.ipynb"]


def test_several_at_once_run_every_notebook_and_return_them_in_reading_order(tmp_path):
    nbs = [_nb(tmp_path / f"0{i}_n.ipynb", f"import pathlib, time\ntime.sleep({0.5 * (3 - i)})\n"
               f"pathlib.Path(out).joinpath('{i}').write_text('ran')") for i in (1, 2, 3)]
    marks = tmp_path / "marks"
    marks.mkdir()
    done = execute_notebooks({"out": str(marks)}, nbs, tmp_path / "executed", progress=False, jobs=2)
    assert [p.name for p in done] == ["01_n.ipynb", "02_n.ipynb", "03_n.ipynb"]
    assert sorted(p.name for p in marks.iterdir()) == ["1", "2", "3"]


def test_each_kernel_runs_in_its_notebooks_folder_and_the_callers_directory_never_moves(tmp_path):
    """Threads share one working directory: a runner that changed it per notebook (papermill's
    ``cwd``) could leave it changed when two notebooks end together, failing the caller's relative
    paths later."""
    import os

    here = os.getcwd()
    folders = [tmp_path / name for name in ("a", "b", "c")]
    nbs = []
    for i, d in enumerate(folders):
        d.mkdir()
        nbs.append(_nb(d / f"0{i + 1}_n.ipynb", f"import os, pathlib, time\ntime.sleep({0.3 * (i % 2)})\n"
                       f"pathlib.Path(out).joinpath('{i}').write_text(os.getcwd())"))
    marks = tmp_path / "marks"
    marks.mkdir()
    execute_notebooks({"out": str(marks)}, nbs, tmp_path / "executed", progress=False, jobs=2)
    assert os.getcwd() == here
    assert [(marks / str(i)).read_text() for i in range(3)] == [str(d) for d in folders]


def test_several_at_once_a_failure_starts_no_other_and_names_the_first_in_reading_order(tmp_path):
    """Two at a time: 01 fails while 02 runs on; 02 finishes, 03 never starts. 02 runs until 01's
    failure is on disk (the runner keeps the failed copy, then stops), not for a fixed time: on a
    loaded machine 01's kernel can take longer to start than 02 takes to sleep."""
    bad = _nb(tmp_path / "01_bad.ipynb", "raise ValueError('no results for dag-4')")
    failed = tmp_path / "executed" / "01_bad.failed.ipynb"
    slow = _nb(tmp_path / "02_slow.ipynb", f"import pathlib, time\nt0 = time.time()\n"
               f"while not pathlib.Path({str(failed)!r}).exists() and time.time() - t0 < 120:\n"
               f"    time.sleep(0.05)\ntime.sleep(0.5)")
    later = _nb(tmp_path / "03_later.ipynb", "import pathlib\npathlib.Path(out).write_text('ran')")
    marker = tmp_path / "later.txt"
    with pytest.raises(NotebookFailed) as err:
        execute_notebooks({"out": str(marker)}, [bad, slow, later], tmp_path / "executed", progress=False, jobs=2)
    assert "01_bad.ipynb" in str(err.value) and "ValueError: no results for dag-4" in str(err.value)
    assert not marker.exists()
    assert sorted(p.name for p in (tmp_path / "executed").iterdir()) == ["01_bad.failed.ipynb", "02_slow.ipynb"]


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        execute_notebooks({}, [], tmp_path / "executed", progress=False, jobs=0)
