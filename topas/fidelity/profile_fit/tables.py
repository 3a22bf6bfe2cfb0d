"""The measured Vidur operator tables (:class:`Calibration`: one folder), the linear operators
they give (measured, scaled by model shape or GPU), and the fit's error measures."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from topas.fidelity.profile_fit.hardware import ALL_OPS, LAYER_OPS, ModelShape


class CalibrationError(ValueError):
    """A calibration folder or table that cannot give a profile; the message names the file."""


# ----------------------------------------------------------------------------- the tables
class OpTable:
    """One Vidur ``mlp.csv`` at TP1: per operator the median kernel time (ms) vs ``num_tokens``.
    Rows repeated for a token count are averaged."""

    def __init__(self, path: Path):
        self.path = path
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["num_tensor_parallel_workers"] == "1"]
        if not rows:
            raise CalibrationError(f"{path}: no TP1 rows")
        missing = [op for op in ALL_OPS if f"time_stats.{op}.median" not in rows[0]]
        if missing:
            raise CalibrationError(f"{path}: missing operator columns {missing}")
        acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            for op in ALL_OPS:
                acc[op][int(r["num_tokens"])].append(float(r[f"time_stats.{op}.median"]))
        self.n = np.array(sorted(acc[ALL_OPS[0]]), dtype=float)
        self.t = {op: np.array([np.mean(acc[op][int(k)]) for k in self.n]) for op in ALL_OPS}
        r0 = rows[0]
        heads, hidden = int(r0["n_head"]), int(r0["n_embd"])
        self.shape = ModelShape(path.stem, "", layers=0, hidden=hidden, heads=heads,
                                kv_heads=int(r0["n_kv_head"]), head_dim=hidden // heads,
                                intermediate=int(r0["n_expanded_embd"]),
                                vocab=int(r0["vocab_size"]))
        self.n_max = int(self.n[-1])

    def at(self, op: str, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=float)
        if tokens.min() < self.n[0] or tokens.max() > self.n[-1]:
            raise ValueError(f"{self.path.name}: {op} asked outside the measured range")
        return np.interp(tokens, self.n, self.t[op])


def read_points(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


@dataclass
class Calibration:
    root: Path
    l3: OpTable            # A100 Llama-3-8B
    cl34: OpTable          # A100 CodeLlama-34B
    l2_7_a100: OpTable
    l2_7_h100: OpTable
    l2_70: OpTable
    qwen72: OpTable
    prefill: dict[str, np.ndarray]   # chunk, kv, attn_prefill, kv_save  (ms per layer)
    decode: dict[str, np.ndarray]    # batch, kv, attn_decode (ms per layer)

    @classmethod
    def load(cls, root: Path) -> "Calibration":
        need = ["a100_Meta-Llama-3-8B_mlp.csv", "a100_CodeLlama-34b-Instruct-hf_mlp.csv",
                "a100_Llama-2-7b-hf_mlp.csv", "h100_Llama-2-7b-hf_mlp.csv",
                "a100_Llama-2-70b-hf_mlp.csv", "a100_Qwen-72B_mlp.csv",
                "a100_l3_8b_tp1_prefill_sampled.csv", "a100_l3_8b_tp1_decode_sampled.csv"]
        if not root.is_dir():
            raise CalibrationError(
                f"calibration folder {root} not found: the Vidur operator tables are needed "
                "(data/calibration/vidur in the repository; pass --calibration DIR or set "
                "$TOPAS_CALIBRATION_DIR)")
        absent = [f for f in need if not (root / f).is_file()]
        if absent:
            raise CalibrationError(f"calibration folder {root} lacks {absent}")
        return cls(root, OpTable(root / need[0]), OpTable(root / need[1]), OpTable(root / need[2]),
                   OpTable(root / need[3]), OpTable(root / need[4]), OpTable(root / need[5]),
                   read_points(root / need[6]), read_points(root / need[7]))


# ----------------------------------------------------------------------------- linear operators
LinearFn = Callable[[str, np.ndarray], np.ndarray]   # (op, tokens) -> ms (per layer, or once)


def measured_linear(table: OpTable) -> LinearFn:
    return lambda op, n: table.at(op, n)


def shape_scaled_linear(base: OpTable, target: ModelShape, tail: OpTable | None = None) -> LinearFn:
    """``base``'s per-op times scaled by the per-token size ratio of each operator
    (``ModelShape.op_size``). Above ``base``'s largest token count, the op's time at that count is
    extended along ``tail``'s measured growth curve (same op, same GPU)."""
    def f(op: str, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        ratio = target.op_size(op) / base.shape.op_size(op)
        inside = np.minimum(n, base.n_max)
        out = base.at(op, inside) * ratio
        if tail is not None and (n > base.n_max).any():
            grow = tail.at(op, np.maximum(n, base.n_max)) / tail.at(op, np.array([base.n_max]))
            out = out * grow
        elif (n > base.n_max).any():
            raise ValueError(f"{op}: token count above {base.n_max} and no tail table")
        return out
    return f


def gpu_ratio_linear(base: LinearFn, a100: OpTable, h100: OpTable) -> LinearFn:
    """``base`` (A100) times the measured H100/A100 ratio of the same operator at the same token
    count (Llama-2-7B tables); above their largest count, the op's mean ratio over 2048..4096."""
    hi = (a100.n >= 2048) & (a100.n <= a100.n_max)

    def f(op: str, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        r = h100.t[op] / a100.t[op]
        ratio = np.where(n <= a100.n_max, np.interp(np.minimum(n, a100.n_max), a100.n, r),
                         float(np.mean(r[hi])))
        return base(op, n) * ratio
    return f


def layer_linear_ms(lin: LinearFn, n: np.ndarray) -> np.ndarray:
    return sum(lin(op, n) for op in LAYER_OPS)


def lm_head_ms(lin: LinearFn, model: ModelShape, sampled: np.ndarray) -> np.ndarray:
    """LM head on ``sampled`` tokens: a [k, hidden] x [hidden, vocab] GEMM, estimated from the
    model's own fused gate+up GEMM ([k, hidden] x [hidden, 2*intermediate]) scaled by the weight
    size ratio vocab / (2 * intermediate) (both weight-read bound at these token counts)."""
    return lin("mlp_up_proj", sampled) * model.op_size("lm_head") / model.op_size("mlp_up_proj")


# ----------------------------------------------------------------------------- fitting
def sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (the fixed formatting of the JSON)."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def rel_err(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    e = np.abs(pred - y) / y
    return {"mean_rel_err": sig(e.mean(), 4), "max_rel_err": sig(e.max(), 4), "n_points": int(e.size)}
