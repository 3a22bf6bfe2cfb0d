"""benchmarks/figures_time.py: a re-render counts as unchanged only when every file is byte-identical."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "figures_time", Path(__file__).resolve().parents[1] / "benchmarks" / "figures_time.py")
figures_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures_time)


def test_differing_names_changed_and_new_files_only(tmp_path):
    new, committed = tmp_path / "new", tmp_path / "committed"
    for d in (new, committed):
        (d / "sub").mkdir(parents=True)
        (d / "same.png").write_bytes(b"\x89PNG same")
        (d / "sub" / "t.md").write_text("| a |\n")
    (committed / "changed.csv").write_text("x\n1\n")
    (new / "changed.csv").write_text("x\n2\n")
    (new / "added.pdf").write_bytes(b"%PDF")
    (committed / "only_committed.md").write_text("not re-rendered this time\n")
    assert figures_time.differing(new, committed) == ["added.pdf", "changed.csv"]


def test_identical_trees_differ_nowhere(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "f.png").write_bytes(bytes(range(256)))
    assert figures_time.differing(tmp_path / "a", tmp_path / "b") == []
