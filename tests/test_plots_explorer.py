"""The weights explorer (notebook 09): the start kept as a reference, the change printed, fixed axes,
the utility terms, overload warnings and the weights that change nothing."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from topas import plots  # noqa: E402
from studies.explorer import plots as explorer_plots  # noqa: E402
from studies.explorer import runs as ex  # noqa: E402


def test_ecdf_has_a_step_per_policy_in_policy_colours_with_mean_and_p99_in_the_legend():
    tasks = {"parrot-fcfs": pd.DataFrame({"jct": [1.0, 2.0, 3.0, 4.0]}), "topas": pd.DataFrame({"jct": [2.0, 2.0]})}
    fig = explorer_plots.plot_jct_ecdf(tasks, title="t")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [matplotlib.colors.to_hex(l.get_color()) for l in lines] == [
        matplotlib.colors.to_hex(plots.policy_color(p)) for p in plots.policy_order(tasks)]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("Parrot-FCFS: mean 2.5 s") for label in labels)
    assert ax.get_xlabel() == "task JCT (s)" and ax.get_ylabel() == "fraction of tasks"
    # the ECDF ends at 1 for every policy
    assert all(l.get_ydata()[-1] == 1.0 for l in lines)
    assert not plots.text_overlaps(fig)


def test_h_age_slider_can_select_its_default():
    """The explorer's H_age slider shows the parameter's own value (60 s), not a grid neighbour."""
    W = pytest.importorskip("ipywidgets")
    for default in (60.0, 60, 37.0):
        slider = W.SelectionSlider(value=float(default), options=explorer_plots.slider_choices(default), description="H_age")
        assert slider.value == float(default)
    assert explorer_plots.slider_choices(60.0) == list(explorer_plots.H_AGE_CHOICES)


def test_the_sliders_are_topas_parameters_and_the_papers_weights_are_all_there():
    from dataclasses import fields

    from topas.policies.topas_params import TopasParams

    assert set(explorer_plots.TOPAS_SLIDERS) <= {f.name for f in fields(TopasParams)}
    assert {"beta", "rho", "H_age", "M", "K"} <= set(explorer_plots.TOPAS_SLIDERS)


def test_the_start_is_a_faded_dashed_curve_on_fixed_axes_beside_the_terms():
    now = {"topas": np.array([1.0, 2.0, 3.0]), "parrot-fcfs": np.array([2.0, 4.0])}
    start = {"topas": np.array([1.0, 5.0]), "parrot-fcfs": np.array([2.0, 4.0])}
    terms = {"J_admit": 10.0, "J_move": 1.0, "V_reuse": 0.1}
    fig = explorer_plots.plot_explorer(now, start, terms, {**terms, "J_admit": 8.0}, xlim=(0.0, 12.0), title="t")
    ax, bx = fig.axes
    assert ax.get_xlim() == (0.0, 12.0)  # given, not fitted to the curves: they never jump
    faded = [line for line in ax.get_lines() if line.get_linestyle() == "--" and line.get_alpha() == 0.35]
    assert len(faded) == 2
    assert [t.get_text() for t in bx.get_yticklabels()] == ["J_admit", "J_move", "V_reuse"]
    assert not plots.text_overlaps(fig)


def test_fixed_limits_cover_every_run_of_the_workload():
    assert explorer_plots.jct_xlim([np.array([1.0, 10.0]), np.array([20.0])]) == (0.0, 22.0)


def test_the_change_against_the_start_is_printed_in_seconds_and_percent():
    start = ex.Run(np.array([10.0] * 100), {})
    now = ex.Run(np.array([9.0] * 100), {})
    assert ex.change_line("TOPAS", now, start) == (
        "TOPAS: mean 9.0 s (-1.0 s, -10.0%), p99 9.0 s (-1.0 s, -10.0%) against the start")
    assert "(+0.0 s, +0.0%)" in ex.change_line("TOPAS", start, start)


def test_weights_whose_probes_match_the_start_are_named_as_doing_nothing():
    ref = ex.Run(np.array([1.0, 2.0]), {})
    probes = {"beta": [ref, ex.Run(np.array([1.0, 2.0]), {})], "rho": [ref, ex.Run(np.array([1.0, 3.0]), {})]}
    assert ex.inert_weights(ref, probes) == ["beta"]
    note = ex.inert_note(["beta"], {"beta": (0.0, 4.0)}, "DAG-4")
    assert note.startswith("At DAG-4, these weights change nothing (runs identical to the start): beta from 0 to 4.")


def test_a_load_above_the_certified_capacity_is_warned(tmp_path):
    table = tmp_path / "capacity_table.csv"
    pd.DataFrame({"workload": ["dag-4", "dag-4", "w"], "policy": ["topas", "lpm", "fcfs"],
                  "capacity": [1.125, 1.375, float("nan")], "upper": [1.25, 1.5, 0.75]}).to_csv(table, index=False)
    assert ex.capacity_warnings("dag-4", 1.2, ["topas", "lpm", "parrot-fcfs"], table) == [
        "topas: load 1.2x is above its certified capacity on dag-4 (1.125x): overload"]
    assert "no certified capacity" in ex.capacity_warnings("w", 0.5, ["fcfs"], table)[0]
    assert ex.capacity_warnings("dag-4", 1.2, ["topas"], tmp_path / "missing.csv") == []


def test_the_explorer_runs_on_release_and_reports_against_the_start():
    pytest.importorskip("ipywidgets")
    from studies.explorer.ui import Explorer

    e = Explorer("dag-4", "parrot-fcfs", 1.2, 0, 8, {"beta": 1.0, "rho": 0.5}, 60.0, progress=False)
    assert e.start["K"] == 64  # a slider's weight not given starts at TOPAS's default
    box = e.widget()
    sliders = [c for c in box.children if hasattr(c, "continuous_update")]
    assert len(sliders) == len(explorer_plots.TOPAS_SLIDERS) + 1 and not any(s.continuous_update for s in sliders)
    lines = e.report({**e.start, "rho": 2.0}, 60.0)
    assert lines[0].startswith("shown: beta=1, rho=2, H_age=60")
    assert lines[1].startswith("TOPAS: mean ") and lines[1].endswith("against the start")
    assert any(line.startswith("TOPAS, mean per decision") for line in lines)
    assert lines[-1].startswith("At DAG-4, 8 tasks")


def test_a_headless_run_builds_no_sliders(monkeypatch):
    """The runner's and the tests' kernels run headless (no one to move a slider; displaying
    ipywidgets can hang nbclient): the widget cell shows a line saying so instead."""
    from IPython.display import Markdown

    from topas.experiments.notebook_params import HEADLESS_ENV
    from pipeline.notebooks import KERNEL_ARGS
    from studies.explorer.ui import Explorer

    assert any(HEADLESS_ENV in a for a in KERNEL_ARGS)
    monkeypatch.setenv(HEADLESS_ENV, "1")
    e = Explorer("dag-4", "parrot-fcfs", 1.2, 0, 8, {"beta": 1.0, "rho": 0.5}, 60.0, progress=False)
    note = e.widget()
    assert isinstance(note, Markdown) and "headless" in note.data
