"""A notebook's prose is checked as the docs are: a paragraph that cites a shipped table states only
numbers that table holds (tests/test_docs.py's rule), and a section it cites ("docs/x.md, "Title"",
"README, "Title"") is a heading of that file."""

from __future__ import annotations

import json
import re

import pytest

from test_docs import numbers_not_in_the_cited_file
from topas.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SECTION = re.compile(r"(README|docs/[\w-]+\.md)[,:]?\s+[\"“]([^\"”]+)[\"”]")
#: text fixes proposed for these notebooks and applied by their owner: strict, so the mark goes once fixed
PENDING: dict[str, str] = {}


def markdown(path) -> str:
    nb = json.loads(path.read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def cited_sections_missing(text: str) -> list[str]:
    missing = []
    for doc, title in SECTION.findall(text):
        path = REPO_ROOT / ("README.md" if doc == "README" else doc)
        title = " ".join(title.split())
        heads = {" ".join(h.lstrip("#").split()) for h in path.read_text().splitlines() if h.startswith("#")} \
            if path.is_file() else set()
        if title not in heads:
            missing.append(f'{doc}, "{title}"')
    return missing


def _marks(path):
    return [pytest.mark.xfail(strict=True, reason=PENDING[path.name])] if path.name in PENDING else []


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name, marks=_marks(p)) for p in NOTEBOOKS])
def test_a_notebook_states_only_numbers_its_cited_tables_hold_and_cites_sections_that_exist(path):
    text = markdown(path)
    bad = numbers_not_in_the_cited_file(text)
    assert not bad, f"{path.name} states numbers its cited tables do not hold: {bad}"
    missing = cited_sections_missing(text)
    assert not missing, f"{path.name} cites sections that do not exist: {missing}"


def test_a_missing_section_is_caught():
    assert cited_sections_missing('See README, "Results so far".') == ['README, "Results so far"']
    assert cited_sections_missing('docs/design.md, "Performance"') == []
