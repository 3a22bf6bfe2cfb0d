"""The JCT ECDF used by the weights explorer (notebook 09)."""

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from topas import plots  # noqa: E402


def test_ecdf_has_a_step_per_policy_in_policy_colours_with_mean_and_p99_in_the_legend():
    tasks = {"parrot-fcfs": pd.DataFrame({"jct": [1.0, 2.0, 3.0, 4.0]}), "topas": pd.DataFrame({"jct": [2.0, 2.0]})}
    fig = plots.plot_jct_ecdf(tasks, title="t")
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
    """Notebook 09's H_age slider shows the parameter's own value (60 s), not a grid neighbour."""
    import json

    W = pytest.importorskip("ipywidgets")
    from topas import plots
    from topas.paths import REPO_ROOT

    nb = json.loads((REPO_ROOT / "notebooks" / "09_weights_explorer.ipynb").read_text())
    source = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "H_age=W.SelectionSlider(value=float(H_age), options=plots.slider_choices(H_age)" in source
    for default in (60.0, 60, 37.0):
        slider = W.SelectionSlider(value=float(default), options=plots.slider_choices(default), description="H_age")
        assert slider.value == float(default)
    assert plots.slider_choices(60.0) == list(plots.H_AGE_CHOICES)
