"""topas.plots helpers of notebooks 02-04: metric against load, the JCT table, ablation bars and table."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from topas import plots  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _summaries(policies=("fcfs", "parrot-fcfs", "topas"), workloads=("chain-3", "dag-4"),
               loads=(1.0, 1.3), seeds=(0, 1), scale=None):
    """Fake run_sweep rows: JCT grows with load; fcfs slowest, topas 10% faster than parrot-fcfs."""
    base = {"fcfs": 100.0, "parrot-fcfs": 50.0, "topas": 45.0, "topas-base": 60.0, "topas-no-reuse": 44.0,
            "topas-no-aging": 55.0, "topas-request-only": 90.0, "lpm": 70.0, "spf": 48.0, "autellix-las": 80.0}
    scale = scale or {}
    rows = []
    for w in workloads:
        for p in policies:
            for l in loads:
                for s in seeds:
                    m = base[p] * l * scale.get(p, 1.0) * (1 + 0.1 * s)
                    rows.append({"workload": w, "policy": p, "load": l, "seed": s, "jct_mean": m,
                                 "jct_p99": 2 * m, "throughput_rps": 0.5 * l})
    return pd.DataFrame(rows)


def test_needs_log_scale():
    assert plots.needs_log_scale([10, 50, 200])
    assert not plots.needs_log_scale([10, 50, 99])
    assert not plots.needs_log_scale([5.0])
    assert not plots.needs_log_scale([0.0, float("nan"), 3.0])


@pytest.mark.parametrize("scale, log", [({}, False), ({"fcfs": 30.0}, False), ({"fcfs": 100.0}, True)])
def test_plot_metric_vs_load_layout_and_scale(scale, log):
    df = _summaries(scale=scale)
    fig = plots.plot_metric_vs_load(df)
    axes = [a for a in fig.axes]
    assert len(axes) == 4  # 2 metrics x 2 workloads
    assert axes[0].get_title() == "Chain-3" and axes[1].get_title() == "DAG-4"
    assert axes[0].get_ylabel().startswith("mean JCT (s)") and axes[2].get_ylabel().startswith("p99 JCT (s)")
    assert axes[2].get_xlabel() == plots.LOAD_LABEL
    assert all((a.get_yscale() == "log") == log for a in axes)
    assert ("log scale" in axes[0].get_ylabel()) == log
    # one line per policy in its colour, one figure legend in policy order
    colours = {matplotlib.colors.to_hex(line.get_color()) for line in axes[0].get_lines()}
    assert {plots.policy_color(p).lower() for p in ("fcfs", "parrot-fcfs", "topas")} <= colours
    (leg,) = fig.legends
    assert [t.get_text() for t in leg.get_texts()] == ["FCFS", "Parrot-FCFS", "TOPAS", "band: min to max over the seeds"]
    # each policy's line has its own marker; a linear axis starts at zero
    markers = {line.get_marker() for line in axes[0].get_lines()}
    assert {plots.policy_marker(p) for p in ("fcfs", "parrot-fcfs", "topas")} <= markers
    if not log:
        assert all(a.get_ylim()[0] == 0 for a in axes)
    # the caption says what the figure was made from
    assert "seeds 0-1 (2 per point)" in plots.place_caption(fig).get_text().replace("\n", " ")
    assert plots.text_overlaps(fig) == []


def test_plot_metric_vs_load_panels_in_canonical_order():
    df = _summaries(workloads=("metagpt-tl", "dag-10-wide", "chain-3"))
    fig = plots.plot_metric_vs_load(df, metrics=("jct_mean",))
    assert [a.get_title() for a in fig.axes] == ["Chain-3", "DAG-10-Wide", "MetaGPT-TL"]
    fig = plots.plot_metric_vs_load(df, metrics=("jct_mean",), workloads=["dag-10-wide", "chain-3"])
    assert [a.get_title() for a in fig.axes] == ["Chain-3", "DAG-10-Wide"]


def test_plot_metric_vs_load_throughput_single_row():
    fig = plots.plot_metric_vs_load(_summaries(), metrics=("throughput_rps",))
    assert len(fig.axes) == 2
    assert fig.axes[0].get_ylabel() == "request throughput (requests/s)"
    assert plots.text_overlaps(fig) == []


def test_jct_table_vs_best_baseline():
    t = plots.jct_table(_summaries(), baselines=("fcfs", "parrot-fcfs"))
    assert list(t["policy"].unique()) == ["fcfs", "parrot-fcfs", "topas"]  # policy order
    assert len(t) == 2 * 2 * 3
    r = t[(t.workload == "dag-4") & (t.load == 1.3) & (t.policy == "topas")].iloc[0]
    assert r["seeds"] == 2
    assert r["mean JCT (s)"] == pytest.approx(45 * 1.3 * 1.05)
    assert r["mean JCT min (s)"] == pytest.approx(45 * 1.3) and r["mean JCT max (s)"] == pytest.approx(45 * 1.3 * 1.1)
    assert r["mean JCT vs best baseline (%)"] == pytest.approx(-10.0)
    assert r["best baseline (mean)"] == "parrot-fcfs"
    assert r["p99 JCT vs best baseline (%)"] == pytest.approx(-10.0)
    base = t[t.policy == "fcfs"]
    assert base["mean JCT vs best baseline (%)"].isna().all()


def test_plot_ablation_bars():
    from studies.grid import ABLATIONS

    df = _summaries(policies=ABLATIONS + ("fcfs", "parrot-fcfs"), workloads=("dag-4",), loads=(1.2,))
    fig = plots.plot_ablation_bars(df, "dag-4")
    ax0, ax1 = fig.axes[:2]
    labels = [t.get_text() for t in ax0.get_yticklabels()]
    assert labels == [plots.policy_label(p) for p in ABLATIONS + ("fcfs", "parrot-fcfs")]
    assert ax0.get_xlabel() == "mean JCT (s)" and ax1.get_xlabel() == "p99 JCT (s)"
    bars = [p for p in ax0.patches if isinstance(p, matplotlib.patches.Rectangle)][: len(labels)]
    assert bars[0].get_width() == pytest.approx(45 * 1.2 * 1.05)  # mean over seeds
    assert matplotlib.colors.to_hex(bars[0].get_facecolor()) == plots.policy_color("topas").lower()
    assert not bars[0].get_hatch() and bars[-1].get_hatch()  # baselines hatched
    assert "DAG-4" in fig._suptitle.get_text()
    assert plots.text_overlaps(fig) == []
    fig = plots.plot_ablation_bars(df, "dag-4", log_x=True)
    assert fig.axes[0].get_xscale() == "log"
    assert plots.text_overlaps(fig) == []


def test_ablation_table_with_paper_numbers(tmp_path):
    from studies.grid import ABLATIONS

    df = _summaries(policies=ABLATIONS + ("parrot-fcfs",), workloads=("dag-4",), loads=(1.2,), seeds=(0,))
    t = plots.ablation_table(df)
    assert list(t["policy"]) == list(ABLATIONS) + ["parrot-fcfs"]
    assert list(t["kind"]) == ["TOPAS"] + ["ablation"] * 4 + ["baseline (reference)"]
    b = t[t.policy == "topas-base"].iloc[0]
    assert b["mean vs TOPAS (%)"] == pytest.approx(100 * (60 - 45) / 45)
    assert b["TOPAS vs it, mean (%)"] == pytest.approx(100 * (45 - 60) / 60)
    paper = [c for c in t.columns if c.startswith(plots.PAPER_LABEL)]
    assert len(paper) == 2 and all("MetaGPT-TL" in c and "0.0175" in c for c in paper)
    assert b[paper[0]] == "-60.5" and b[paper[1]] == "-53.6"
    assert t[t.policy == "topas-no-reuse"].iloc[0][paper[0]].startswith("-51.0 to -44.9")
    assert t[t.policy == "topas-request-only"].iloc[0][paper[0]] == ""
    assert pd.isna(t[t.policy == "topas"].iloc[0]["mean vs TOPAS (%)"])
    plots.save_table(t, "abl", tmp_path)
    assert "paper (reported)" in (tmp_path / "abl.md").read_text()


def test_trace_status():
    t = plots.trace_status(["metagpt-sop", "dag-4"], ["dag-4"], note="see the MetaGPT issue")
    assert list(t["trace found"]) == [False, True]
    assert t["status"].iloc[0] == "skipped: see the MetaGPT issue" and t["status"].iloc[1] == "ok"
