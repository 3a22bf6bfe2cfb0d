"""Wall time of ``make figures``: every figure and table re-rendered from the stored results.

The target: under 2 minutes on a 2-core machine. This runs what ``make figures`` runs
(``scripts/reproduce.py --figures-only``) into a temporary folder, so the committed ``figures/``
is left alone, and prints the wall time, each notebook's, the load average before and after (the
machine may be shared), and whether every file written is byte-identical to the one in
``figures/`` (a re-render of unchanged results must be).

    python benchmarks/figures_time.py              # --jobs: all cores, as make figures
    python benchmarks/figures_time.py --jobs 1     # the notebooks one after another
    make bench-figures

It fails (exit status 1) when the re-render fails (e.g. the shipped results are stale for the
current code: ``tests/test_results_pack.py`` says why) or a file differs from ``figures/``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "figures"
#: The one input of the re-render that lives in the output folder (``--figures-only`` reads it).
TABLE_CSV = "results_synthetic.csv"
TARGET_S = 120.0


def differing(new: Path, committed: Path) -> list[str]:
    """The files under ``new`` whose bytes differ from (or are absent in) ``committed``, sorted."""
    out = []
    for p in sorted(q for q in new.rglob("*") if q.is_file()):
        rel = p.relative_to(new)
        ref = committed / rel
        if not ref.is_file() or ref.read_bytes() != p.read_bytes():
            out.append(str(rel))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=None, help="notebooks at once (default: all cores)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="topas-figures-") as tmp:
        out = Path(tmp) / "figures"
        out.mkdir()
        shutil.copy2(FIGURES / TABLE_CSV, out / TABLE_CSV)
        cmd = [sys.executable, str(REPO / "scripts" / "reproduce.py"), "--figures-only", "--no-progress",
               "--out-dir", str(out)] + (["--jobs", str(args.jobs)] if args.jobs else [])
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], sep="\n", file=sys.stderr)
            print(f"error: make figures failed (exit status {r.returncode}) after {wall:.1f} s", file=sys.stderr)
            return 1
        per_nb = re.findall(r"^(\d\d_\S+\.ipynb) done in ([\d.]+) s$", r.stdout, flags=re.M)
        diff = differing(out, FIGURES)
        n_files = sum(1 for q in out.rglob("*") if q.is_file())
    print(f"make figures (scripts/reproduce.py --figures-only, --jobs {args.jobs or os.cpu_count()}) "
          f"on {os.cpu_count()} cores: {wall:.1f} s wall (target < {TARGET_S:.0f} s: "
          f"{'met' if wall < TARGET_S else 'missed'})")
    print(f"load average (1 min) {load0[0]:.2f} before, {load1[0]:.2f} after")
    for name, s in sorted(per_nb, key=lambda x: -float(x[1])):
        print(f"  {name:32s} {float(s):6.1f} s")
    if diff:
        print(f"{len(diff)} of {n_files} files differ from figures/: {', '.join(diff)}", file=sys.stderr)
        return 1
    print(f"all {n_files} files byte-identical to figures/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
