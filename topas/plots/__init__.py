"""The shared plotting style: policy names, colours and order; saving figures and tables.

Every notebook uses these so that a policy has the same colour, name and position in every
figure of the reproduction::

    from topas import plots
    plots.use_style()
    fig, ax = plt.subplots()
    sns.barplot(df, x="policy", y="jct_mean", hue="policy",
                order=plots.policy_order(df.policy), palette=plots.policy_palette(df.policy), ax=ax)
    plots.save_figure(fig, "jct_by_policy")           # figures/jct_by_policy.png and .pdf
    plots.save_table(summary, "jct_by_policy")         # figures/jct_by_policy.csv and .md

Colours and markers: every policy and every router has its own colour and its own marker, the
same in every figure (``policy_style`` / ``router_color``, ``router_marker``). TOPAS is a strong
vermillion and its ablations are shades of it (told apart by marker); TOPAS+ (ours) is black; the
baselines take distinct colours of the Okabe-Ito colour-blind-safe palette, the routers Paul
Tol's. Workload panels are in ``WORKLOAD_ORDER`` (Chain-3, DAG-4, DAG-10-Wide, MetaGPT-SOP,
MetaGPT-TL); ``add_caption(fig, run_caption(summaries))`` writes the tasks per run, the seeds and
what a band spans under a figure. Axes of measured quantities are linear from zero unless the
values span ``LOG_SPAN`` (100x) or more. A policy not listed here (a new
one, or a typo) is not an error: it gets a stable fallback colour and its raw name as label.

Output folder: ``out_dir`` if given, else ``$TOPAS_FIGURES`` if set, else ``<repo>/scratch/figures``
(git-ignored; only ``make reproduce`` / ``make figures`` write ``figures/``).
Files are written atomically (a temporary file in the same folder, then a rename), so a killed
notebook never leaves a half-written figure or table behind.
"""

from topas.paths import REPO_ROOT  # noqa: F401  (plots.REPO_ROOT: where figures/ is by default)
from topas.plots.style import (AGENT_COLORS, FALLBACK_COLORS, FALLBACK_MARKERS, LOG_SPAN, POLICY_COLORS,
    POLICY_LABELS, POLICY_MARKERS, POLICY_ORDER, ROUTER_COLORS, ROUTER_MARKERS, ROUTER_ORDER, WORKLOAD_LABELS,
    WORKLOAD_ORDER, policy_color, policy_label, policy_marker, policy_order, policy_palette, policy_style,
    router_color, router_marker, router_order, use_style, workload_label, workload_order)  # noqa: F401
from topas.plots.captions import SEED_RANGE, add_caption, log_note, place_caption, run_caption  # noqa: F401
from topas.plots.output import (MEASURED_ON_ENV, _atomic_write, evidence_label, figures_dir, measured_caption,
    save_figure, save_table, text_overlaps, to_markdown)  # noqa: F401
from topas.plots.workloads import (draw_workflow, plot_workflows, workflow_layout, workload_sizes)  # noqa: F401
from topas.plots.load import (LOAD_LABEL, METRIC_LABELS, PAPER_LABEL, ablation_table, jct_table,
    needs_log_scale, plot_ablation_bars, plot_metric_vs_load, trace_status)  # noqa: F401

__all__ = [
    "FALLBACK_MARKERS",
    "LOG_SPAN",
    "POLICY_MARKERS",
    "ROUTER_MARKERS",
    "ROUTER_ORDER",
    "WORKLOAD_ORDER",
    "policy_marker",
    "policy_style",
    "router_marker",
    "workload_order",
    "SEED_RANGE",
    "add_caption",
    "place_caption",
    "log_note",
    "run_caption",
    "AGENT_COLORS",
    "FALLBACK_COLORS",
    "LOAD_LABEL",
    "MEASURED_ON_ENV",
    "METRIC_LABELS",
    "PAPER_LABEL",
    "POLICY_COLORS",
    "POLICY_LABELS",
    "POLICY_ORDER",
    "ROUTER_COLORS",
    "WORKLOAD_LABELS",
    "ablation_table",
    "draw_workflow",
    "evidence_label",
    "figures_dir",
    "jct_table",
    "measured_caption",
    "needs_log_scale",
    "plot_ablation_bars",
    "plot_metric_vs_load",
    "plot_workflows",
    "policy_color",
    "policy_label",
    "policy_order",
    "policy_palette",
    "router_color",
    "router_order",
    "save_figure",
    "save_table",
    "text_overlaps",
    "to_markdown",
    "trace_status",
    "use_style",
    "workflow_layout",
    "workload_label",
    "workload_sizes",
]
