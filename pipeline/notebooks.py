"""Execute the reproduction notebooks in reading order with papermill.

``scripts/reproduce.py`` (``make reproduce`` / ``make figures``) calls :func:`execute_notebooks`.
A parameter a notebook does not declare in its ``parameters`` cell is refused before anything
runs (papermill itself only warns and runs the defaults). Executed copies are kept (default ``notebooks/executed/``) so a reviewer can open what ran; a
failing notebook stops the run with an error that names the notebook and the cell that failed.

A notebook executes into a temporary file (``.NN_topic.running.ipynb``) that is renamed to
``NN_topic.ipynb`` only when it ran to the end, so ``executed/`` never holds a half-executed
copy under a notebook's name: a failed run is kept as ``NN_topic.failed.ipynb`` (with the
traceback in the failing cell, for inspection), an interrupted one (Ctrl-C) is deleted.

``jobs`` > 1 runs that many notebooks at once, each in its own kernel (``make figures`` does:
re-rendering from stored results, the notebooks are independent and each is one busy process,
so one notebook per core halves the wall time on two cores); a failure then lets the notebooks
already running finish, starts no other, and reports the first failed notebook in reading order.

The kernel runs with its log level at CRITICAL: ipykernel's own log lines ("Kernel is running
over TCP without encryption", once per notebook; "KeyboardInterrupt caught in kernel") are noise
in a batch run. Errors in a cell still reach the executed notebook and :class:`NotebookFailed`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from topas.experiments.notebook_params import HEADLESS_ENV
from topas.paths import REPO_ROOT

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNEL = "python3"
#: Extra kernel command-line arguments: silence ipykernel's own log (see the module docstring), and
#: tell the notebook it runs headless (``topas.experiments.notebook_params.headless``).
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL",
               f"--IPKernelApp.exec_lines=import os; os.environ['{HEADLESS_ENV}'] = '1'"]


class UnknownParameter(ValueError):
    """A parameter the notebook's ``parameters`` cell does not declare (papermill only warns)."""


def check_parameter_names(nb: Path, parameters: Mapping[str, Any]) -> None:
    """Raise :class:`UnknownParameter` for a name in ``parameters`` that ``nb`` does not declare."""
    from topas.experiments.notebook_params import declared_parameters

    declared = declared_parameters(nb)
    unknown = [k for k in parameters if k not in declared]
    if unknown:
        raise UnknownParameter(f"{nb.name} takes no parameter {', '.join(unknown)}; "
                               f"its parameters: {', '.join(declared)}")


class NotebookFailed(RuntimeError):
    """A notebook raised; the message names the notebook, the cell and the error."""

    def __init__(self, notebook: str, cell: int | None, error: str) -> None:
        where = f"cell {cell}" if cell is not None else "(cell unknown)"
        super().__init__(f"notebook {notebook} failed in {where}: {error}")
        self.notebook, self.cell, self.error = notebook, cell, error


def notebook_paths(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The numbered notebooks (``NN_topic.ipynb``) of ``directory``, in reading order."""
    return sorted(p for p in directory.glob("[0-9][0-9]_*.ipynb"))


def execute_notebooks(
    parameters: Mapping[str, Any],
    notebooks: Sequence[Path] | None = None,
    executed_dir: Path = NOTEBOOKS_DIR / "executed",
    progress: bool = True,
    jobs: int = 1,
) -> list[Path]:
    """Run each notebook with ``parameters`` (``jobs`` at a time); return the executed copies'
    paths, in reading order.

    Raises :class:`UnknownParameter`, before running anything, for a parameter a notebook does
    not declare; :class:`NotebookFailed` at the first failure (the executed copy, with the traceback
    in the failing cell, is kept as ``NN_topic.failed.ipynb`` for inspection). A
    ``KeyboardInterrupt`` removes the copy in progress and propagates.
    """
    if jobs < 1:
        raise ValueError(f"execute_notebooks: jobs must be >= 1, got {jobs}")
    notebooks = list(notebooks) if notebooks is not None else notebook_paths()
    for nb in notebooks:  # before anything runs: a misspelt name would run the defaults
        check_parameter_names(nb, parameters)
    executed_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(notebooks), desc="notebooks", unit="nb", disable=not progress)
    try:
        if jobs == 1 or len(notebooks) < 2:
            done = []
            for nb in notebooks:
                bar.set_postfix_str(nb.name)
                done.append(_execute_one(nb, parameters, executed_dir))
                bar.update()
            return done
        return _execute_parallel(notebooks, parameters, executed_dir, jobs, bar)
    finally:
        bar.close()


def _execute_parallel(notebooks: list[Path], parameters: Mapping[str, Any], executed_dir: Path,
                      jobs: int, bar: tqdm) -> list[Path]:
    """:func:`execute_notebooks` with ``jobs`` notebooks at once (threads: each waits on its kernel)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor, wait

    stop = threading.Event()  # set by the first failure: no notebook starts after it

    def run(nb: Path) -> Path | None:
        if stop.is_set():
            return None
        try:
            return _execute_one(nb, parameters, executed_dir)
        except BaseException:
            stop.set()
            raise
        finally:
            bar.update()

    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="notebook") as pool:
        futures = [pool.submit(run, nb) for nb in notebooks]
        try:
            wait(futures)
        except BaseException:  # Ctrl-C: start nothing more (each running kernel gets it too)
            stop.set()
            raise
    for f in futures:  # the first failure in reading order
        if f.exception() is not None:
            raise f.exception()
    return [f.result() for f in futures]


def _execute_one(nb: Path, parameters: Mapping[str, Any], executed_dir: Path) -> Path:
    """Execute one notebook into ``executed_dir``; its executed copy (see the module docstring)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    print(f"running {nb.name}", flush=True)
    t0, cpu0 = time.perf_counter(), children_cpu()
    out = executed_dir / nb.name
    tmp = executed_dir / f".{nb.stem}.running.ipynb"
    failed = executed_dir / f"{nb.stem}.failed.ipynb"
    try:
        # the kernel starts in the notebook's folder (nbclient's ``resources``), not through
        # papermill's ``cwd``: that changes this process's directory, which threads would race on
        pm.execute_notebook(
            str(nb), str(tmp), parameters=dict(parameters), kernel_name=KERNEL,
            resources={"metadata": {"path": str(nb.parent)}}, progress_bar=False, extra_arguments=KERNEL_ARGS,
        )
    except PapermillExecutionError as e:
        if tmp.is_file():
            tmp.replace(failed)
        raise NotebookFailed(nb.name, e.exec_count, f"{e.ename}: {e.evalue}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)  # interrupted or crashed: nothing half-executed stays
        raise
    tmp.replace(out)
    failed.unlink(missing_ok=True)  # an earlier failure of this notebook is out of date
    wall = time.perf_counter() - t0
    print(f"{nb.name} done in {wall:.1f} s{busy_note(wall, cpu0, children_cpu())}", flush=True)
    return out


def busy_note(wall: float, cpu0: float | None, cpu1: float | None) -> str:
    """`` (N CPU s: X cores busy)`` for the :func:`children_cpu` readings ``cpu0`` and ``cpu1``
    taken ``wall`` seconds apart; ``""`` when either is unknown."""
    if cpu0 is None or cpu1 is None:
        return ""
    return f" ({cpu1 - cpu0:.0f} CPU s: {(cpu1 - cpu0) / wall:.2f} cores busy)"


def children_cpu() -> float | None:
    """CPU seconds (user + system) of this process's finished children and theirs: a notebook's
    kernel and its sweep workers, once the kernel has exited. None where ``resource`` is missing
    (Windows), or in a thread of a parallel run (the children of the notebooks beside it would
    count too)."""
    import threading

    try:
        import resource
    except ImportError:
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
