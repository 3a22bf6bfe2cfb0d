"""topas.plots: policy names/colours/order, the style, atomic figure and table output, workflow drawing."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from conftest import stage, task, trace  # noqa: E402

from topas import plots  # noqa: E402
from topas.policies import available_policies  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --- names, colours, order ------------------------------------------------------------------


def test_every_policy_has_label_colour_and_place():
    assert set(plots.POLICY_ORDER) == set(plots.POLICY_LABELS) == set(plots.POLICY_COLORS)
    assert len(plots.POLICY_ORDER) == len(set(plots.POLICY_ORDER))
    assert plots.POLICY_LABELS["topas"] == "TOPAS"
    assert plots.POLICY_LABELS["topas-no-reuse"] == "TOPAS w/o reuse"
    assert plots.POLICY_LABELS["autellix-las"] == "Autellix-LAS"


def test_registered_policies_are_all_styled():
    names = set(available_policies())
    missing = names - set(plots.POLICY_COLORS)
    assert not missing, f"policies without a colour/label in topas.plots: {sorted(missing)}"


def test_colours_are_valid_and_distinct():
    cols = [mcolors.to_hex(c).lower() for c in plots.POLICY_COLORS.values()]
    assert len(set(cols)) == len(cols)
    assert not set(cols) & {mcolors.to_hex(c).lower() for c in plots.FALLBACK_COLORS}


def test_ablations_are_shades_of_topas():
    """TOPAS and its ablations share a hue (told apart by marker); TOPAS+ (ours) and every
    baseline are a clearly different hue or achromatic (grey, black)."""
    import colorsys

    from studies.grid import ABLATIONS

    def hsv(c):
        return colorsys.rgb_to_hsv(*mcolors.to_rgb(c))

    h = hsv(plots.POLICY_COLORS["topas"])[0]
    for p in plots.POLICY_ORDER:
        hue, sat, _ = hsv(plots.POLICY_COLORS[p])
        d = min(abs(hue - h), 1 - abs(hue - h))
        if p in ABLATIONS:
            assert d < 0.03, p
        elif sat > 0.05:  # fcfs (grey) and topas-plus (black) have no hue
            assert d > 0.08, p


def _pairs(colours, markers, names):
    return [(mcolors.to_hex(colours(n)).lower(), markers(n)) for n in names]


def test_every_registered_policy_has_its_own_colour_and_marker():
    """A policy is told apart by its colour alone and by its marker alone (print in grey,
    colour-blind readers): no two registered policies share either."""
    from topas.policies import available_policies

    names = list(available_policies())
    assert set(names) <= set(plots.POLICY_MARKERS), sorted(set(names) - set(plots.POLICY_MARKERS))
    pairs = _pairs(plots.policy_color, plots.policy_marker, names)
    assert len({c for c, _ in pairs}) == len(names), pairs
    assert len({m for _, m in pairs}) == len(names), pairs
    assert plots.policy_style("topas") == {"color": plots.POLICY_COLORS["topas"], "marker": "o"}


def test_every_registered_router_has_its_own_colour_and_marker():
    from topas.cluster import available_routers

    names = list(available_routers())
    assert set(names) == set(plots.ROUTER_ORDER) == set(plots.ROUTER_COLORS) == set(plots.ROUTER_MARKERS), \
        sorted(set(names) ^ set(plots.ROUTER_ORDER))
    pairs = _pairs(plots.router_color, plots.router_marker, names)
    assert len({c for c, _ in pairs}) == len(names), pairs
    assert len({m for _, m in pairs}) == len(names), pairs
    # our router is drawn as our policy; an unknown router gets a stable fallback
    assert plots.router_color("topas") == plots.policy_color("topas")
    assert plots.router_color("my-router") == plots.router_color("my-router") in plots.FALLBACK_COLORS
    assert plots.router_marker("my-router") in plots.FALLBACK_MARKERS
    assert plots.router_order(["wasma", "zz", "kairos", "aa"]) == ["kairos", "wasma", "aa", "zz"]


def test_workload_panel_order_is_canonical():
    assert plots.WORKLOAD_ORDER == ("chain-3", "dag-4", "dag-10-wide", "metagpt-sop", "metagpt-tl")
    assert set(plots.WORKLOAD_ORDER) == set(plots.WORKLOAD_LABELS)
    assert plots.workload_order(["metagpt-tl", "dag-10-wide", "x", "dag-4", "chain-3", "metagpt-sop", "dag-4"]) == [
        "chain-3", "dag-4", "dag-10-wide", "metagpt-sop", "metagpt-tl", "x"]


def test_run_caption_says_tasks_seeds_and_band():
    df = pd.DataFrame({"seed": [0, 1, 2, 0], "n_tasks": [500] * 4})
    assert plots.run_caption(df) == "500 tasks per run; seeds 0-2 (3 per point); band: min to max over the seeds"
    assert plots.run_caption(df.assign(seed=0)) == "500 tasks per run; seed 0 (1 per point)"
    assert plots.run_caption(pd.DataFrame({"tasks": [200], "seeds": [3]})) == \
        "200 tasks per run; 3 seeds per point (their mean)"
    assert plots.run_caption(pd.DataFrame({"tasks": [60, 200], "seeds": [1, 1]})) == \
        "60 or 200 tasks per run; 1 seed per point"
    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    fig.legend([ax.plot([1, 2])[0]], ["x"], loc="outside lower center")
    assert plots.add_caption(fig, "Line: mean", plots.run_caption(df, interval=None)) == \
        "Line: mean. 500 tasks per run; seeds 0-2 (3 per point)."
    fig.suptitle("added after the plotting function")  # still laid out: the caption is placed at save
    assert plots.text_overlaps(fig) == []
    t = plots.place_caption(fig)
    assert t.get_text().replace("\n", " ") == "Line: mean. 500 tasks per run; seeds 0-2 (3 per point)."
    assert plots.place_caption(fig) is t and fig.texts.count(t) == 1
    # under the legend, not over it
    r = fig.canvas.get_renderer()
    assert t.get_window_extent(r).y1 <= fig.legends[0].get_window_extent(r).y0


def test_palette_is_consistent_and_ordered():
    pal = plots.policy_palette(["topas", "fcfs", "topas", "spf"])
    assert list(pal) == ["fcfs", "spf", "topas"]
    full = plots.policy_palette()
    assert list(full) == list(plots.POLICY_ORDER)
    assert all(full[p] == pal[p] for p in pal)


def test_unknown_policy_falls_back():
    assert plots.policy_label("my-new-policy") == "my-new-policy"
    c = plots.policy_color("my-new-policy")
    assert c in plots.FALLBACK_COLORS
    assert plots.policy_color("my-new-policy") == c  # stable
    mcolors.to_rgb(c)
    assert plots.policy_order(["zeta", "topas", "alpha", "fcfs"]) == ["fcfs", "topas", "alpha", "zeta"]
    assert plots.policy_palette(["zeta"]) == {"zeta": plots.policy_color("zeta")}


def test_workload_labels():
    assert plots.workload_label("dag-10-wide") == "DAG-10-Wide"
    assert plots.workload_label("chain-3") == "Chain-3"
    assert plots.workload_label("other") == "other"
    assert plots.workload_label("random-dag-1003") == "Random DAG 1003"
    assert plots.workload_label("random-dag-x") == "random-dag-x"


# --- output ---------------------------------------------------------------------------------


def _small_figure():
    plots.use_style()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], color=plots.policy_color("topas"), label=plots.policy_label("topas"))
    ax.set_xlabel("load (x nominal rate)")
    ax.set_ylabel("mean JCT (s)")
    ax.legend()
    return fig


def test_save_figure_writes_png_and_pdf(tmp_path):
    paths = plots.save_figure(_small_figure(), "f", tmp_path / "out")
    assert [p.name for p in paths] == ["f.png", "f.pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"
    assert sorted(os.listdir(tmp_path / "out")) == ["f.pdf", "f.png"]  # no temporary files left


def test_save_figure_pdf_is_reproducible(tmp_path):
    fig = _small_figure()
    a = plots.save_figure(fig, "f", tmp_path / "a")[1].read_bytes()
    b = plots.save_figure(fig, "f", tmp_path / "b")[1].read_bytes()
    assert a == b


def test_output_dir_default_and_env(tmp_path, monkeypatch):
    """No folder named: an interactive session's git-ignored scratch folder, never figures/."""
    monkeypatch.delenv("TOPAS_FIGURES", raising=False)
    assert plots.figures_dir() == plots.REPO_ROOT / "scratch" / "figures"
    monkeypatch.setenv("TOPAS_FIGURES", str(tmp_path / "env"))
    assert plots.figures_dir() == tmp_path / "env"
    assert plots.figures_dir(tmp_path / "x") == tmp_path / "x"
    paths = plots.save_table(pd.DataFrame({"a": [1]}), "t")
    assert all(p.parent == tmp_path / "env" and p.stat().st_size > 0 for p in paths)


def test_failed_write_leaves_nothing(tmp_path):
    class Boom(Exception):
        pass

    def write(tmp):
        open(tmp, "w").write("half")
        raise Boom

    with pytest.raises(Boom):
        plots._atomic_write(tmp_path / "x.csv", write)
    assert os.listdir(tmp_path) == []


def test_save_table_csv_and_markdown(tmp_path):
    df = pd.DataFrame(
        {"policy": ["topas", "a|b"], "n": [3, 4], "jct (s)": [1234.567, float("nan")], "ok": [True, False]}
    )
    csv, md = plots.save_table(df, "t", tmp_path)
    assert (csv.name, md.name) == ("t.csv", "t.md")
    back = pd.read_csv(csv)
    assert list(back.columns) == list(df.columns) and back["jct (s)"][0] == pytest.approx(1234.567)
    lines = md.read_text().splitlines()
    assert lines[0] == "| policy | n | jct (s) | ok |"
    assert lines[1] == "|---|---:|---:|---|"
    assert lines[2] == "| topas | 3 | 1,234.6 | True |"
    assert lines[3] == "| a\\|b | 4 |  | False |"


def test_to_markdown_needs_no_tabulate():
    # pandas' DataFrame.to_markdown needs tabulate, which is not a dependency
    assert plots.to_markdown(pd.DataFrame({"x": [1.25]}), floatfmt=".2f") == "| x |\n|---:|\n| 1.25 |\n"


def test_text_overlaps_detects_overlap():
    fig, ax = plt.subplots()
    ax.set_axis_off()
    ax.text(0.5, 0.5, "hello world")
    assert plots.text_overlaps(fig) == []
    ax.text(0.5, 0.5, "overlapping")
    assert plots.text_overlaps(fig) == [("hello world", "overlapping")]


# --- workloads ------------------------------------------------------------------------------


def _diamond():
    return trace(
        {"a": 100, "b": 200, "c": 300},
        [
            task(
                "t0",
                0.0,
                stage("A", "a", 10, 5),
                stage("B", "b", 20, 6, parents=("A",)),
                stage("C", "c", 30, 7, parents=("A",)),
                stage("D", "a", 40, 8, parents=("B", "C")),
            ),
            task("t1", 1.0, stage("A", "a", 50, 9)),
        ],
    )


def test_workflow_layout_by_generation():
    pos = plots.workflow_layout(_diamond().tasks[0])
    assert pos["A"][0] == 0 and pos["B"][0] == pos["C"][0] == 1 and pos["D"][0] == 2
    assert pos["B"][1] != pos["C"][1] and pos["A"][1] == 0


def test_draw_workflow_labels_and_colours():
    fig, ax = plt.subplots()
    t = _diamond().tasks[0]
    colors = plots.draw_workflow(t, ax, title="diamond")
    assert set(colors) == {"a", "b", "c"} and len(set(colors.values())) == 3
    labels = {x.get_text() for x in ax.texts}
    assert {"A", "B", "C", "D"} <= labels
    # nodes of the same agent (A and D, agent "a") share a colour
    faces = ax.collections[0].get_facecolors()
    order = list(t.topo_order)
    assert (faces[order.index("A")] == faces[order.index("D")]).all()
    assert ax.get_title() == "diamond"
    assert plots.text_overlaps(fig) == []


def test_workload_sizes_table():
    df = plots.workload_sizes([_diamond()], kv_budget_tokens=1000)
    assert list(df["agent"]) == ["a", "b", "c", "all agents"]
    a = df.set_index("agent")
    assert a.loc["a", "prefix tokens"] == 100
    assert a.loc["a", "mean input tokens"] == pytest.approx((10 + 40 + 50) / 3)
    assert a.loc["a", "calls per task"] == pytest.approx(1.5)
    assert a.loc["all agents", "prefix tokens"] == 600
    assert a.loc["all agents", "prefix / KV budget (%)"] == pytest.approx(60.0)
    assert a.loc["all agents", "calls per task"] == pytest.approx(2.5)
    assert (df["KV budget (tokens)"] == 1000).all()


def test_plot_workflows_is_readable(tmp_path):
    plots.use_style()
    tr = _diamond()
    fig = plots.plot_workflows({"x": tr, "y": tr})
    assert len(fig.axes) == 2
    assert plots.text_overlaps(fig) == []
    assert all(p.stat().st_size > 0 for p in plots.save_figure(fig, "dags", tmp_path))
