#!/usr/bin/env python
"""Regenerate the committed synthetic traces data/traces/{chain-3,dag-4,dag-10-wide,dag-4-10k,chain-2}.json.gz.

Each file is ``SYNTHETIC[name]()`` with the generator's defaults (topas/workload/synthetic.py);
``dag-4-10k`` is DAG-4's generator with 10,000 tasks (:data:`LONG`; its first 1,000 tasks are
``dag-4``'s: the same generator and seed), for notebook 13's 64-engine scaling runs; ``chain-2`` is
the mechanism case of notebook 06 (``topas.workload.synthetic.MECHANISM``). Every file is
written by ``topas.workload.write_trace``, which is byte-deterministic: running this script again
reproduces the committed files bit for bit (tests/test_synthetic.py checks it).

``--held-out`` writes the held-out family of random workflows instead
(:mod:`topas.workload.random_dag`): ``random-dag-<seed>`` for every generator seed of
``topas.experiments.protocol.seeds.HELD_OUT_WORKFLOW_SEEDS``, with the generator's defaults
(tests/test_random_dag.py checks they regenerate bit for bit).

    python scripts/make_traces.py                 # the synthetic traces into data/traces/
    python scripts/make_traces.py --out /tmp/t --only dag-4
    python scripts/make_traces.py --held-out      # the held-out random workflows
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path

try:
    import topas  # noqa: F401
except ImportError:  # running from a checkout without `make install`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topas.paths import traces_dir
from topas.workload.synthetic import MECHANISM, SYNTHETIC
from topas.workload.trace_io import write_trace

#: Longer versions of a synthetic workload: file name -> (generator, number of tasks).
LONG = {"dag-4-10k": ("dag-4", 10_000)}


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: data/traces/)")
    ap.add_argument("--only", choices=sorted([*SYNTHETIC, *LONG, *MECHANISM]), default=None,
                    help="write only this workload")
    ap.add_argument("--held-out", action="store_true",
                    help="write the held-out random workflows (one per HELD_OUT_WORKFLOW_SEEDS seed) instead")
    args = ap.parse_args(argv)
    if args.held_out and args.only:
        ap.error("--held-out and --only exclude each other")
    out = args.out if args.out is not None else traces_dir()
    out.mkdir(parents=True, exist_ok=True)
    if args.held_out:
        from topas.experiments.protocol.seeds import HELD_OUT_WORKFLOW_SEEDS
        from topas.workload import random_dag

        names = [random_dag.trace_name(s) for s in HELD_OUT_WORKFLOW_SEEDS]
        held_out = {random_dag.trace_name(s): s for s in HELD_OUT_WORKFLOW_SEEDS}
    else:
        names = [args.only] if args.only else [*SYNTHETIC, *LONG, *MECHANISM]
        held_out = {}
    written = []
    for name in names:
        if name in held_out:
            trace = random_dag.generate(held_out[name])
        elif name in LONG:
            gen, n = LONG[name]
            trace = dataclasses.replace(SYNTHETIC[gen](n_tasks=n), name=name)
        else:
            trace = {**SYNTHETIC, **MECHANISM}[name]()
        path = write_trace(trace, out / f"{name}.json.gz")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        print(f"wrote {path}: {len(trace.tasks)} tasks, {trace.num_requests} requests, "
              f"{len(trace.agents)} agents, sha256 {digest}")
        written.append(path)
    return written


if __name__ == "__main__":
    main()
