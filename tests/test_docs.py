"""The repository stands alone: its references point into docs/, and docs/ points at real code."""

from __future__ import annotations

import re
import subprocess

import pytest

from topas.paths import REPO_ROOT

DOCS = REPO_ROOT / "docs"


def tracked_text_files() -> list[str]:
    r = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    skip = ("data/results/", "figures/", ".parquet", ".gz", ".xz", ".png", ".pdf")
    return [f for f in r.stdout.splitlines() if not any(s in f for s in skip)]


def test_nothing_refers_outside_the_repository():
    """No file cites the design notes or the calibration folder that sat beside the repository."""
    bad = []
    for rel in tracked_text_files():
        path = REPO_ROOT / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"\bPAPER\.md|\bDESIGN\.md|\.\./shared|\bshared/calibration|\bshared/(PAPER|DESIGN)", line):
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "references outside the repository:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", ["method.md", "design.md", "capacity.md", "topas_plus.md", "cluster.md", "protocol.md"])
def test_docs_name_only_code_that_exists(doc):
    text = (DOCS / doc).read_text()
    paths = set(re.findall(r"`((?:topas|scripts|tests|data)/[A-Za-z0-9_./-]+\.(?:py|md|csv|json))`", text))
    paths |= set(re.findall(r"(?<![\w/`])((?:topas|scripts)/[a-z_/]+\.py)", text))
    assert paths, f"{doc} names no code"
    missing = sorted(p for p in paths if not (REPO_ROOT / p).is_file())
    assert not missing, f"{doc} names files that do not exist: {missing}"


def test_method_covers_every_term_and_parameter():
    text = (DOCS / "method.md").read_text()
    for symbol in ("J_admit", "J_move", "J_redo", "J_revoke", "V_reuse", "Delta_task", "L_i(H, t)", "g_i(t)",
                   "d_r(t)", "n_a(t)", "lambda_r", "GREEDYPACK", "B_swap", "mu", "B_t"):
        assert symbol in text, symbol
    from topas.policies.topas import TopasParams
    import dataclasses

    for f in dataclasses.fields(TopasParams):
        if f.name not in ("reuse", "aging", "seed"):
            assert f"`{f.name}" in text, f"docs/method.md does not document TopasParams.{f.name}"
    for func in ("aging", "expected_longest_path", "delta_task", "j_admit", "j_move", "j_redo", "j_revoke",
                 "v_reuse", "lookahead_counts"):
        assert f"`{func}`" in text, func


def test_topas_plus_doc_covers_every_parameter_and_says_it_is_ours():
    text = (DOCS / "topas_plus.md").read_text()
    assert "ours" in text.splitlines()[0] and "not the paper" in text.splitlines()[0]
    import dataclasses

    from topas.policies.topas_plus import TopasPlusParams

    for f in dataclasses.fields(TopasPlusParams):
        assert f"`{f.name}`" in text, f"docs/topas_plus.md does not document TopasPlusParams.{f.name}"
    assert "topas_plus.md" in (DOCS / "method.md").read_text()
