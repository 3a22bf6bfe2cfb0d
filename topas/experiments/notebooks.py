"""Execute the reproduction notebooks in reading order with papermill.

``scripts/reproduce.py`` (``make reproduce`` / ``make figures``) calls :func:`execute_notebooks`.
Executed copies are kept (default ``notebooks/executed/``) so a reviewer can open what ran; a
failing notebook stops the run with an error that names the notebook and the cell that failed.

A notebook executes into a temporary file (``.NN_topic.running.ipynb``) that is renamed to
``NN_topic.ipynb`` only when it ran to the end, so ``executed/`` never holds a half-executed
copy under a notebook's name: a failed run is kept as ``NN_topic.failed.ipynb`` (with the
traceback in the failing cell, for inspection), an interrupted one (Ctrl-C) is deleted.

The kernel runs with its log level at CRITICAL: ipykernel's own log lines ("Kernel is running
over TCP without encryption", once per notebook; "KeyboardInterrupt caught in kernel") are noise
in a batch run. Errors in a cell still reach the executed notebook and :class:`NotebookFailed`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from topas.paths import REPO_ROOT

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNEL = "python3"
#: Extra kernel command-line arguments: silence ipykernel's own log (see the module docstring).
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL"]


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
) -> list[Path]:
    """Run each notebook with ``parameters``; return the executed copies' paths.

    Raises :class:`NotebookFailed` at the first failure (the executed copy, with the traceback
    in the failing cell, is kept as ``NN_topic.failed.ipynb`` for inspection). A
    ``KeyboardInterrupt`` removes the copy in progress and propagates.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    notebooks = list(notebooks) if notebooks is not None else notebook_paths()
    executed_dir.mkdir(parents=True, exist_ok=True)
    done: list[Path] = []
    bar = tqdm(notebooks, desc="notebooks", unit="nb", disable=not progress)
    for nb in bar:
        bar.set_postfix_str(nb.name)
        print(f"running {nb.name}", flush=True)
        out = executed_dir / nb.name
        tmp = executed_dir / f".{nb.stem}.running.ipynb"
        failed = executed_dir / f"{nb.stem}.failed.ipynb"
        try:
            pm.execute_notebook(
                str(nb), str(tmp), parameters=dict(parameters), kernel_name=KERNEL,
                cwd=str(nb.parent), progress_bar=False, extra_arguments=KERNEL_ARGS,
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
        done.append(out)
    return done
