"""How long a sweep of simulations takes, before it starts: a per-policy cost model measured here.

A simulation's CPU time grows with its task count, its policy (TOPAS's search costs several times
FCFS's per decision) and its workload (a MetaGPT task costs several synthetic ones).
:func:`calibrate` measures, on this machine, the CPU seconds per task of each policy on each
workload a plan runs it on (and on the synthetic ones): one short run each
(:data:`CALIBRATION_TASKS` tasks at 1.2x the nominal load, seed 0; a few seconds in all), cached
in the results store's folder under the code's fingerprint (``plan_costs-<fingerprint>.json``:
any change to the engine, the policies or the workloads measures again). :func:`estimate_cpu`
(in :mod:`topas.experiments.run_cost`, beside the sweeps' longest-first order) prices an
experiment as its task count x that per-task cost (its own workload's, else the mean over the
policy's calibrated workloads) x its engine count. The wall time on the jobs it will use is the
pool schedule of :func:`topas.sglang.pool.schedule` (longest first, each to the first free
worker: the rule the GPU plan uses), a lower bound for a process pool that also loads traces and
writes results. Short runs at one load miss how a queue's growth raises the cost per task: runs
well below the calibration's load cost less than priced, runs past capacity more.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tqdm.auto import tqdm

from topas.experiments.plan import format_hours
from topas.experiments.run_cost import _cache_path, cached_costs, estimate_cpu, longest_first  # noqa: F401
from topas.experiments.spec import Experiment, prepare, run_experiment
from topas.experiments.store_layout import default_store_root
from topas.sets import SYNTHETIC
from topas.sglang.pool import schedule

__all__ = ["CALIBRATION_TASKS", "CALIBRATION_WORKLOADS", "cached_costs", "calibrate", "estimate_cpu", "longest_first",
           "sim_plan_lines"]

CALIBRATION_TASKS = 20
CALIBRATION_WORKLOADS = SYNTHETIC


def calibrate(policies: Sequence[str], root: Path | None = None,
              pairs: Iterable[tuple[str, str]] = (), progress: bool = True) -> dict[str, dict[str, float]]:
    """``{policy: {workload: CPU seconds per task}}`` on this machine (module docstring): every
    policy on every :data:`CALIBRATION_WORKLOADS` workload and every ``(policy, workload)`` of
    ``pairs`` (a plan's own: the MetaGPT workloads cost 5-8x the synthetic ones per task), each
    measured once per code version and kept in the cache in ``root`` (default: the results
    store's folder). A workload's trace is read before its runs are timed: a sweep's worker reads
    it once for all its runs. ``progress``: a bar on stderr while 20 or more runs are measured."""
    root = Path(root) if root is not None else default_store_root()
    costs = cached_costs(root)
    wanted = {(p, w) for p in policies for w in CALIBRATION_WORKLOADS} | set(pairs)
    todo = sorted((w, p) for p, w in wanted if w not in costs.get(p, {}))
    warm: set[str] = set()
    for w, p in tqdm(todo, desc="calibrating", unit="run", disable=not progress or len(todo) < 20, leave=False):
        exp = Experiment(w, p, load=1.2, seed=0, n_tasks=CALIBRATION_TASKS)
        if w not in warm:
            prepare(exp)  # the trace read and checked, outside the timing
            warm.add(w)
        t = time.process_time()
        run_experiment(exp)
        costs.setdefault(p, {})[w] = (time.process_time() - t) / CALIBRATION_TASKS
    if todo:
        root.mkdir(parents=True, exist_ok=True)
        path = _cache_path(root)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(costs, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    return costs


def sim_plan_lines(stages: Sequence[tuple[str, Sequence[Experiment], int]], jobs: int,
                   costs: Mapping[str, Mapping[str, float]]) -> tuple[list[str], float, float]:
    """The simulator's plan: one line per ``(name, experiments to run, stored)`` stage with its
    runs and expected CPU time, then the total CPU and the wall time on ``jobs`` workers (each
    stage's runs one pool; the stages one after the other). Returns ``(lines, cpu_s, wall_s)``."""
    lines, cpu_total, wall_total = [], 0.0, 0.0
    for name, exps, stored in stages:
        cpu = [estimate_cpu(e, costs) for e in exps]
        wall = schedule(cpu, jobs).wall
        cpu_total += sum(cpu)
        wall_total += wall
        kept = f" ({stored} already stored, skipped)" if stored else ""
        lines.append(f"  {name}: {len(exps)} simulations{kept}, about {format_hours(sum(cpu))} of CPU, "
                     f"{format_hours(wall)} on {jobs} job(s)")
    lines.append(f"  total: about {format_hours(cpu_total)} of CPU, {format_hours(wall_total)} of wall time on "
                 f"{jobs} job(s) (per-task CPU of each policy measured here, {CALIBRATION_TASKS}-task runs; "
                 f"trace loading and notebook execution not included)")
    return lines, cpu_total, wall_total
