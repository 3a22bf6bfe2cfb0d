"""The fitted profiles written: byte-identical JSON (sorted keys, rounded floats), written atomically,
and a one-line summary of each."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from topas.fidelity.profile_fit.build import build
from topas.fidelity.profile_fit.catalog import specs
from topas.fidelity.profile_fit.tables import Calibration


# ----------------------------------------------------------------------------- output
def dumps(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def fit_all(cal_dir: Path) -> dict[str, str]:
    cal = Calibration.load(cal_dir)
    return {s.name: dumps(build(s, cal)) for s in specs(cal)}


def write(texts: dict[str, str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in texts.items():
        p = out / f"{name}.json"
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=out, delete=False,
                                         prefix=f".{name}.", suffix=".tmp") as f:
            f.write(text)
        os.chmod(f.name, 0o644)
        os.replace(f.name, p)
        paths.append(p)
    return paths


def summary(path: Path) -> str:
    from topas.engine.cost import load_profile   # validates what was written
    cm = load_profile(path)
    fe = cm.meta["fit_error"]
    return (f"{cm.name}: B={cm.kv_budget_tokens} tokens, mu={cm.kv_bytes_per_token:g} B/token | "
            f"prefill 4k={cm.prefill_time([(4096, 0)]):.3f}s (err mean {fe['prefill']['mean_rel_err']:.1%}, "
            f"max {fe['prefill']['max_rel_err']:.1%}) | decode b32@32k={cm.decode_time(32, 32768) * 1e3:.1f}ms "
            f"(err mean {fe['decode']['mean_rel_err']:.1%}, max {fe['decode']['max_rel_err']:.1%})")
