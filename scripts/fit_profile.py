#!/usr/bin/env python3
"""Fit the engine cost-model profiles ``data/profiles/*.json`` from measured GPU operator timings.

Usage::

    python scripts/fit_profile.py                      # (re)write every profile into data/profiles/
    python scripts/fit_profile.py --out /tmp/p         # write elsewhere
    python scripts/fit_profile.py --check              # exit 1 if data/profiles/ differs from a refit
    python scripts/fit_profile.py --calibration DIR    # the Vidur tables (default below)

Inputs: the Vidur operator tables in ``data/calibration/vidur/`` (override with
``--calibration`` or ``$TOPAS_CALIBRATION_DIR``; see that folder's README.md). Only ``csv`` and
``numpy`` are used, and the output is byte-identical on every run: keys sorted, every float rounded
to a fixed number of significant digits before it is written.

The fit is :mod:`topas.fidelity.profile_fit` (the method, step by step, in its docstring and in
``data/profiles/README.md``); this script is its command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from topas.fidelity.profile_fit import (DEFAULT_CALIBRATION, DEFAULT_OUT, CalibrationError,  # noqa: E402
                                        fit_all, summary, write)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path,
                    default=Path(os.environ.get("TOPAS_CALIBRATION_DIR", DEFAULT_CALIBRATION)),
                    help="folder with the Vidur tables (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write (default: %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the files in --out differ from a refit")
    args = ap.parse_args(argv)
    try:
        texts = fit_all(args.calibration)
    except CalibrationError as e:
        print(e, file=sys.stderr)
        return 1
    if args.check:
        bad = [n for n, t in texts.items()
               if not (args.out / f"{n}.json").is_file()
               or (args.out / f"{n}.json").read_text(encoding="utf-8") != t]
        for n in bad:
            print(f"differs from a refit: {args.out / (n + '.json')}", file=sys.stderr)
        return 1 if bad else 0
    for p in write(texts, args.out):
        print(summary(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
