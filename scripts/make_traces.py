#!/usr/bin/env python
"""Regenerate the committed synthetic traces data/traces/{chain-3,dag-4,dag-10-wide,dag-4-10k}.json.gz.

Each file is ``SYNTHETIC[name]()`` with the generator's defaults (topas/workload/synthetic.py);
``dag-4-10k`` is DAG-4's generator with 10,000 tasks (:data:`LONG`; its first 1,000 tasks are
``dag-4``'s: the same generator and seed), for notebook 13's 64-engine scaling runs. Every file is
written by ``topas.workload.write_trace``, which is byte-deterministic: running this script again
reproduces the committed files bit for bit (tests/test_synthetic.py checks it).

    python scripts/make_traces.py                 # all three into data/traces/
    python scripts/make_traces.py --out /tmp/t --only dag-4
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
from topas.workload.synthetic import SYNTHETIC
from topas.workload.trace_io import write_trace

#: Longer versions of a synthetic workload: file name -> (generator, number of tasks).
LONG = {"dag-4-10k": ("dag-4", 10_000)}


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: data/traces/)")
    ap.add_argument("--only", choices=sorted([*SYNTHETIC, *LONG]), default=None, help="write only this workload")
    args = ap.parse_args(argv)
    out = args.out if args.out is not None else traces_dir()
    out.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else [*SYNTHETIC, *LONG]
    written = []
    for name in names:
        if name in LONG:
            gen, n = LONG[name]
            trace = dataclasses.replace(SYNTHETIC[gen](n_tasks=n), name=name)
        else:
            trace = SYNTHETIC[name]()
        path = write_trace(trace, out / f"{name}.json.gz")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        print(f"wrote {path}: {len(trace.tasks)} tasks, {trace.num_requests} requests, "
              f"{len(trace.agents)} agents, sha256 {digest}")
        written.append(path)
    return written


if __name__ == "__main__":
    main()
