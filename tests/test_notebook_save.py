"""Lab saves a notebook as git holds it: make lab's save hook strips outputs, execution counts and
the kernel's language_info, and keeps the cell ids, so a saved committed notebook is unchanged."""

import json

import pytest

from topas.paths import REPO_ROOT

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbstripout")


def test_saving_a_run_notebook_writes_the_committed_file_back():
    from topas.notebook_save import strip_outputs

    path = REPO_ROOT / "notebooks" / "09_weights_explorer.ipynb"
    committed = path.read_text()
    nb = json.loads(committed)
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["execution_count"] = 3
            c["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x\n"]}]
    model = {"type": "notebook", "content": nb}
    strip_outputs(model, path="notebooks/09_weights_explorer.ipynb", contents_manager=None)
    assert nbformat.writes(model["content"]) + "\n" == committed
    other = {"type": "file", "content": "text"}
    strip_outputs(other)
    assert other["content"] == "text"
