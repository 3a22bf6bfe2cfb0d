"""The policy and workload sets, declared once: which baselines a verdict compares against, which
policies are the candidates, and which workloads are in-sample, held out, synthetic or MetaGPT.

Every study, script and notebook takes its sets from here, so adding a baseline or a workload is
one line. Two baseline sets, for two kinds of verdict:

* :data:`PAPER_BASELINES`, the paper's five (FCFS, LPM, SPF, Parrot-FCFS, Autellix-LAS): the
  figures in the paper's setup compare TOPAS with the best of these: the synthetic results table
  of ``make reproduce`` (``figures/results_synthetic.md``), the ablations (notebook 04), the
  engine-model and robustness tables (notebooks 11, 14), notebook 12's capacities, operating
  points, headroom and space of readings, and ``topas capacity``.
* :data:`PROTOCOL_BASELINES`, FCFS, LPM, SPF and k-LPM as SGLang runs them (stock), and
  :data:`GUARDED_BASELINES`, the same four with the in-batch guard that TOPAS's plans follow
  (``topas.policies.guarded``): the protocol's verdicts (notebook 16, the README's "What we find",
  ``docs/protocol.md``; notebooks 02, 03 and 08 read the same runs) compare the
  :data:`CANDIDATES` with the best stock baseline and, separately, with the best guarded one.
  Parrot-FCFS and Autellix-LAS are not in it (their capacity in the capacity search is at most
  0.938x on the synthetic workloads, near FCFS's: docs/protocol.md); k-LPM, the literature's
  strongest simple rule beside LPM, is.

Workload families: :data:`IN_SAMPLE` are the workloads TOPAS's defaults and TOPAS+ were selected
on (docs/topas_plus.md), so results there are in-sample even on evaluation seeds; every other
workload is held out (:data:`HELD_OUT`: the MetaGPT workflows and the random DAGs).
"""

from __future__ import annotations

#: The paper's baselines: the best of these is "the best baseline" of the paper-setup figures.
PAPER_BASELINES = ("fcfs", "lpm", "spf", "parrot-fcfs", "autellix-las")
#: TOPAS and its ablations (the paper's ablation study; notebook 04).
ABLATIONS = ("topas", "topas-no-reuse", "topas-no-aging", "topas-base", "topas-request-only")
#: The paper's figures' policies: its baselines and TOPAS.
PAPER_POLICIES = PAPER_BASELINES + ("topas",)

#: The protocol's baselines (stock) and the same with the in-batch guard; the guarded names are
#: those ``topas.policies.guarded`` registers (``GUARDED_OF``; tests/test_sets.py checks it).
PROTOCOL_BASELINES = ("fcfs", "lpm", "spf", "k-lpm")
GUARDED_BASELINES = tuple(f"{b}-guarded" for b in PROTOCOL_BASELINES)
#: The protocol's candidates: TOPAS as we read it and TOPAS+ (ours).
CANDIDATES = ("topas", "topas-plus")

#: The paper's synthetic workloads, Chain-3, DAG-4 and DAG-10-Wide.
SYNTHETIC = ("chain-3", "dag-4", "dag-10-wide")
#: The recorded MetaGPT workflows.
METAGPT = ("metagpt-sop", "metagpt-tl")
#: Random DAGs no selection saw (data/traces/README.md).
RANDOM_DAGS = ("random-dag-1000", "random-dag-1001", "random-dag-1002", "random-dag-1003")
#: Selected on: TOPAS's defaults and TOPAS+ were chosen on these (on tuning seeds).
IN_SAMPLE = SYNTHETIC
#: Held out: no selection saw them.
HELD_OUT = METAGPT + RANDOM_DAGS

__all__ = [
    "ABLATIONS",
    "CANDIDATES",
    "GUARDED_BASELINES",
    "HELD_OUT",
    "IN_SAMPLE",
    "METAGPT",
    "PAPER_BASELINES",
    "PAPER_POLICIES",
    "PROTOCOL_BASELINES",
    "RANDOM_DAGS",
    "SYNTHETIC",
]
