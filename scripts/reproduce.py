#!/usr/bin/env python3
"""The one reproduction driver (``make reproduce`` / ``make figures`` call it): a thin command line
over :mod:`pipeline.reproduce` (what it runs, writes and prints is documented there;
``--help`` lists the options)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from pipeline.reproduce import *  # noqa: E402,F401,F403  (tests and notebooks use its names)
from pipeline.reproduce import cli, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(cli())
