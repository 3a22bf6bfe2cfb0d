"""The repository stands alone: its references point into docs/, and docs/ points at real code."""

from __future__ import annotations

import csv
import io
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


@pytest.mark.parametrize("doc", ["method.md", "design.md", "capacity.md", "topas_plus.md", "cluster.md", "protocol.md",
                                 "usage.md", "analysis.md", "fidelity.md", "gpu.md", "several-engines.md"])
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


# ----------------------------------------------------------------------- numbers come from shipped files
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?![\w.]*\d)")
FENCE = re.compile(r"```.*?```", re.S)
CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"\]\([^)]*\)|<!--.*?-->|arXiv[ :]\d+\.\d+", re.S)


def _numbers(text: str) -> set[str]:
    """Every number in ``text`` outside code, links and comments, as a plain decimal ('+96.9%' -> '96.9')."""
    text = LINK.sub(" ", CODE.sub(" ", FENCE.sub(" ", text)))
    return {m.group().lstrip("+-").replace(",", "") for m in NUMBER.finditer(text)}


def _file_numbers(path) -> set[str]:
    """Every number a shipped table holds, as a plain decimal; a CSV is read cell by cell (its commas
    separate fields, not thousands)."""
    text = path.read_text()
    cells = [c for row in csv.reader(io.StringIO(text)) for c in row] if path.suffix == ".csv" else [text]
    return {m.group().lstrip("+-").replace(",", "") for cell in cells for m in NUMBER.finditer(cell)}


def _shipped_numbers(*folders: str) -> set[str]:
    found: set[str] = set()
    for folder in folders:
        for path in sorted((REPO_ROOT / folder).glob("*")):
            if path.suffix in (".md", ".csv"):
                found |= _file_numbers(path)
    return found


def unsourced_numbers(text: str) -> list[str]:
    """The numbers in ``text`` that no table in figures/ and no file in data/paper/ holds."""
    known = _shipped_numbers("figures", "data/paper")
    # list ordinals and counts of the notebooks are not results
    allowed = {"1", "2", "3", "4", "5", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12",
               "13", "14"}
    return sorted(n for n in _numbers(text) if n not in known and n not in allowed)


def test_every_number_in_the_readme_and_results_comes_from_a_shipped_file():
    for doc in (REPO_ROOT / "README.md", DOCS / "results.md"):
        bad = unsourced_numbers(doc.read_text())
        assert not bad, f"{doc.name} states numbers no file in figures/ or data/paper/ holds: {bad}"


CITED = re.compile(r"`((?:figures|data/paper|data/results)/[\w./-]+\.(?:md|csv))`")


def _held(rel: str) -> set[str]:
    """The numbers a cited table holds, in its .md and its .csv twin."""
    held: set[str] = set()
    for path in {REPO_ROOT / rel, REPO_ROOT / rel.replace(".md", ".csv"), REPO_ROOT / rel.replace(".csv", ".md")}:
        if path.is_file():
            held |= _file_numbers(path)
    return held


LIST_ITEM = re.compile(r"^(?:[-*]|\d+\.)\s+")


def _paragraphs_and_list_items(text: str) -> list[tuple[str, bool]]:
    """Paragraphs (split at blank lines), with a list split into its items, each without its
    marker: ``(text, is_list_item)``. Each item of a list is checked against the tables it cites,
    not against every table its siblings cite."""
    out: list[tuple[str, bool]] = []
    for para in re.split(r"\n\s*\n", text):
        if not LIST_ITEM.match(para.strip()):
            out.append((para, False))
            continue
        items: list[str] = []
        for line in para.strip().split("\n"):
            if LIST_ITEM.match(line.strip()) or not items:
                items.append(LIST_ITEM.sub("", line.strip(), count=1))
            else:
                items[-1] += "\n" + line
        out += [(item, True) for item in items]
    return out


def numbers_not_in_the_cited_file(text: str) -> list[str]:
    """For each paragraph that cites a table (`figures/x.md`, `data/paper/x.csv`, `data/results/.../x.csv`),
    the numbers that paragraph states and none of the tables it cites holds. A markdown table counts as
    one paragraph and each item of a list one paragraph; a table or a list item is also checked against
    the tables cited by the paragraph that introduces it (the one right before it, ending in ':')."""
    bad = []
    introduced: list[str] = []  # what the paragraph (or item) just before introduces
    list_intro: list[str] = []  # what the paragraph before the current list introduces
    for para, is_item in _paragraphs_and_list_items(FENCE.sub(" ", text)):
        cited = [rel for rel in CITED.findall(para) if (REPO_ROOT / rel).is_file()]  # not an output path
        if is_item:
            cited += [rel for rel in list_intro if rel not in cited]
        elif para.strip().startswith("|"):
            cited += [rel for rel in introduced if rel not in cited]
        introduced = cited if para.rstrip().endswith(":") else []
        if not is_item and not para.strip().startswith("|"):
            list_intro = introduced
        if not cited:
            continue
        held = set().union(*(_held(rel) for rel in cited))
        bad += [f"{n} (cites {', '.join(cited)})" for n in sorted(_numbers(para)) if n not in held]
    return bad


def test_a_paragraph_s_numbers_are_in_the_table_it_cites():
    bad = numbers_not_in_the_cited_file((REPO_ROOT / "README.md").read_text())
    assert not bad, f"README.md states numbers its cited tables do not hold: {bad}"


# docs/results.md is generated from figures/ (test_generated_parts_equal_what_the_generator_writes_now);
# every other page is written by hand and checked here. No page needs an allow-list: a setting stays
# out of a paragraph that cites a table, or is named as the code value it is (`reading_tasks=200`).
HAND_WRITTEN = sorted(p.name for p in DOCS.glob("*.md") if p.name != "results.md")


@pytest.mark.parametrize("doc", HAND_WRITTEN)
def test_every_docs_page_states_only_numbers_its_cited_tables_hold(doc):
    bad = numbers_not_in_the_cited_file((DOCS / doc).read_text())
    assert not bad, f"docs/{doc} states numbers its cited tables do not hold: {bad}"


def test_the_docs_pages_cite_tables():
    """The check above is not vacuous: the pages that report results cite the tables they come from."""
    for doc in ("analysis.md", "several-engines.md", "fidelity.md", "design.md"):
        assert CITED.search((DOCS / doc).read_text()), f"docs/{doc} cites no table"


def test_a_stale_number_on_a_docs_page_is_caught():
    """A doctored docs page fails the check: a number changed in a paragraph, in a table that
    paragraph introduces, and a number that another table holds but the paragraph does not cite."""
    analysis = (DOCS / "analysis.md").read_text()
    # the TOPAS capacity on DAG-4, in the inline table under "Capacity decides most of the verdict"
    assert "| DAG-4 | 1.250 | 1.625 |" in analysis
    doctored = analysis.replace("| DAG-4 | 1.250 | 1.625 |", "| DAG-4 | 1.250 | 1.635 |")
    assert [b.split()[0] for b in numbers_not_in_the_cited_file(doctored)] == ["1.635"]
    # a prose number in a paragraph that cites figures/headroom_table.md
    assert "13.1-23.7% below" in analysis
    doctored = analysis.replace("13.1-23.7% below", "13.1-23.9% below")
    assert [b.split()[0] for b in numbers_not_in_the_cited_file(doctored)] == ["23.9"]
    # 461.5: a number figures/headroom_table.md does not hold, in a paragraph that cites that table
    doctored = analysis.replace("13.1-23.7% below", "13.1-461.5% below")
    assert any(b.startswith("461.5 (cites figures/headroom_table.md") for b in numbers_not_in_the_cited_file(doctored))
    # a wall time figures/cluster_scaling_table.csv does not hold (it changes with every run)
    engines = (DOCS / "several-engines.md").read_text()
    wall = re.search(r"took ([0-9.]+) s \(least-load \+ FCFS\)", engines).group(1)
    doctored = engines.replace(f"{wall} s (least-load + FCFS)", "31 s (least-load + FCFS)")
    assert [b.split()[0] for b in numbers_not_in_the_cited_file(doctored)] == ["31"]


def test_a_csv_is_read_cell_by_cell(tmp_path):
    """A CSV's commas separate cells: '4,2,0.5' holds 4, 2 and 0.5, not the number 420.5."""
    path = tmp_path / "t.csv"
    path.write_text("engines,load,tasks\n4,0.5,\"1,000\"\n")
    assert _file_numbers(path) == {"4", "0.5", "1000"}


def test_a_stale_number_is_caught():
    """A doctored README (a number no shipped file holds) fails the check above."""
    import re

    readme = (REPO_ROOT / "README.md").read_text()
    share = re.search(r"per decision in the simulator,\s+([0-9]+\.[0-9]+)% of serving time", readme).group(1)
    known = _shipped_numbers("figures", "data/paper")
    # the share with one of its decimals changed (the last first), to a number no shipped file holds
    dot = share.index(".")
    doctored = next(d for i in reversed(range(dot + 1, len(share))) for c in "0123456789"
                    if (d := share[:i] + c + share[i + 1:]) != share and d not in known)
    assert unsourced_numbers(readme.replace(f"{share}%", f"{doctored}%")) == [doctored]
    # 1.06 is in some figures/ table, but not in the one the paragraph cites
    mean = re.search(r"([0-9]+\.[0-9]+) ms mean per decision", readme).group(1)
    assert any(b.startswith("1.06 ") for b in numbers_not_in_the_cited_file(readme.replace(f"{mean} ms", "1.06 ms")))


def test_each_list_item_is_checked_against_its_own_tables():
    """A list is not one paragraph: a number one item states is checked against the tables that
    item cites (and those the list's introduction cites), not against every table of its siblings."""
    import re

    # the decision mean the overhead table holds (the README's finding states it)
    mean = re.search(r"([0-9]+\.[0-9]+) ms mean per decision", (REPO_ROOT / "README.md").read_text()).group(1)
    assert mean in _held("figures/overhead_table.md")
    text = ("1. TOPAS is 12.4% slower (`figures/paper_vs_ours.md`).\n"
            f"2. Its decisions take {mean} ms (`figures/overhead_table.md`).\n")
    held = _held("figures/paper_vs_ours.md")
    assert "12.4" not in held
    assert [b.split()[0] for b in numbers_not_in_the_cited_file(text)] == ["12.4"]
    # the same item in a list introduced by a paragraph citing a table that holds it passes
    intro = "Both from these tables (`figures/overhead_table.md`):\n\n"
    assert numbers_not_in_the_cited_file(intro + text.replace("12.4", mean)) == []


def test_a_changed_figure_makes_the_generated_parts_stale(tmp_path):
    """The generated tables follow figures/: a changed number there changes what the generator writes."""
    import shutil

    import pandas as pd

    from pipeline.results_doc import findings_table, results_markdown

    figures = REPO_ROOT / "figures"
    for name in ("capacity_table.csv", "capacity_table.md", "verdict_table.csv", "verdict_table.md",
                 "paper_vs_ours.csv", "paper_vs_ours.md"):
        shutil.copy(figures / name, tmp_path / name)
    lat = pd.read_csv(tmp_path / "verdict_table.csv")
    top = lat.index[lat["near_capacity"]][0]
    lat.loc[top, "jct_rel_pct"] = 12.345
    lat.to_csv(tmp_path / "verdict_table.csv", index=False)
    (tmp_path / "verdict_table.md").write_text((tmp_path / "verdict_table.md").read_text() + "\nchanged\n")
    assert "+12.3% [" in findings_table(tmp_path) and findings_table(tmp_path) != findings_table(figures)
    assert results_markdown(tmp_path) != results_markdown(figures)


def test_generated_parts_equal_what_the_generator_writes_now():
    from pipeline.results_doc import BEGIN, END, findings_table, results_markdown

    figures = REPO_ROOT / "figures"
    assert (DOCS / "results.md").read_text() == results_markdown(figures), \
        "docs/results.md is stale: run python -m pipeline.results_doc"
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme.split(BEGIN)[1].split(END)[0].strip()
    assert block == findings_table(figures), "README's findings table is stale: run python -m pipeline.results_doc"


def test_readme_is_short_and_in_order():
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    heads = [h for h in re.findall(r"^## (.+)$", text, re.M)]
    order = ["What the paper claims", "What we find", "Reproduce and test", "The package", "Where to go next"]
    assert [h for h in heads if h in order] == order, heads


def test_docs_index_lists_every_page_and_no_user_document_names_an_issue():
    index = (DOCS / "README.md").read_text()
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not list {page.name}"
    for page in [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        hits = re.findall(r"\bissues? #?\d+", page.read_text(), re.I)
        assert not hits, f"{page.name} refers to issue numbers: {hits}"
