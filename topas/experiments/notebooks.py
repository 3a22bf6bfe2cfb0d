"""Execute the reproduction notebooks in reading order with papermill.

``scripts/reproduce.py`` (``make reproduce`` / ``make figures``) calls :func:`execute_notebooks`.
Executed copies are kept (default ``notebooks/executed/``) so a reviewer can open what ran; a
failing notebook stops the run with an error that names the notebook and the cell that failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from topas.paths import REPO_ROOT

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNEL = "python3"


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
    in the failing cell, is kept for inspection).
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
        try:
            pm.execute_notebook(
                str(nb), str(out), parameters=dict(parameters), kernel_name=KERNEL,
                cwd=str(nb.parent), progress_bar=False,
            )
        except PapermillExecutionError as e:
            raise NotebookFailed(nb.name, e.exec_count, f"{e.ename}: {e.evalue}") from None
        done.append(out)
    return done
