"""JupyterLab's save hook for ``make lab``: a notebook is written to disk without its outputs.

``make lab`` passes ``--ContentsManager.pre_save_hook=topas.notebook_save.strip_outputs``: every
save (autosave included) goes through nbstripout's own ``strip_output`` with the settings of the
git filter ``make lab`` installs (cell ids kept, the kernel's ``language_info`` dropped), so the
file on disk is byte for byte what git holds and ``git status`` stays clean after a session.
Lab keeps showing the outputs of the open notebook; they are not saved (figures are in
``scratch/figures/`` or, from ``make reproduce``, in ``figures/``).
"""

from __future__ import annotations

from typing import Any

#: the same settings as the git filter (Makefile, ``lab``)
EXTRA_KEYS = ["metadata.language_info"]


def strip_outputs(model: dict[str, Any], **kwargs: Any) -> None:
    """jupyter_server pre-save hook: strip a notebook model's outputs in place."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    # lazy: nbformat and nbstripout come with the lab extras; only Jupyter calls this hook
    import nbformat
    from nbstripout import strip_output

    nb = nbformat.from_dict(model["content"])
    strip_output(nb, keep_output=False, keep_count=False, keep_id=True, extra_keys=EXTRA_KEYS)
    model["content"] = nb
