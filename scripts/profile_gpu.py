#!/usr/bin/env python
"""Measure prefill/decode/swap times on the GPU an SGLang server runs on; write a profile.

The output is a ``topas.profile/1`` JSON like ``data/profiles/*.json`` (the simulator's cost
model, ``topas.engine.cost``), so the simulator and the server can be compared on the same trace.

* prefill(N new, C cached) and decode(B, T): measured through the running server's HTTP API and
  fitted by :func:`topas.fidelity.profile_server.profile_server` (the fidelity work's server
  profiler, which uses the same relative least-squares fit as ``scripts/fit_profile.py``,
  :func:`topas.engine.cost.fit_relative`); this script adds nothing to that part.
* swap (host <-> GPU): measured here with PyTorch alone (no SGLang), on this machine's GPU:
  copies of KV-sized blocks between device memory and pinned host memory in both directions, for
  several sizes; ``latency_s`` and ``bandwidth_bytes_per_s`` are the intercept and the inverse
  slope of a least-squares line through (bytes, seconds), taking the slower direction. They replace
  the profile's placeholder ``swap`` section (a server without a host KV tier cannot measure it).

    python scripts/profile_gpu.py --server http://127.0.0.1:30000 --out data/profiles/h100-80gb_qwen2.5-32b.json
    python scripts/profile_gpu.py --swap-only --out data/profiles/h100-80gb_qwen2.5-32b.json   # patch swap only
    python scripts/profile_gpu.py --swap-only                                                # print it

Run it on the GPU box, next to the server (the swap part needs torch with CUDA; without a GPU
it says so and leaves ``swap`` as the server profiler wrote it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

try:
    import topas  # noqa: F401
except ImportError:  # running from a checkout without `make install`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES_MB = (1, 4, 16, 64, 256)


def measure_swap(repeats: int = 5, sizes_mb=SIZES_MB) -> dict | None:
    """Host<->GPU copy time of pinned blocks; None without a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    import numpy as np

    rows = []
    for mb in sizes_mb:
        n = mb * 2**20
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        for direction, (dst, src) in (("d2h", (host, dev)), ("h2d", (dev, host))):
            dst.copy_(src, non_blocking=True)  # warm-up
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            rows.append({"direction": direction, "bytes": n, "seconds": float(np.median(times))})
        del dev, host
    fits = {}
    for direction in ("d2h", "h2d"):
        pts = [(r["bytes"], r["seconds"]) for r in rows if r["direction"] == direction]
        x, y = np.array(pts, dtype=float).T
        slope, intercept = np.polyfit(x, y, 1)
        fits[direction] = {"bandwidth_bytes_per_s": float(1.0 / slope), "latency_s": float(max(intercept, 0.0))}
    slow = min(fits.values(), key=lambda f: f["bandwidth_bytes_per_s"])
    return {
        **slow,
        "source": (f"measured by scripts/profile_gpu.py on {torch.cuda.get_device_name()}: pinned host <-> device "
                   f"copies of {', '.join(map(str, sizes_mb))} MiB, median of {repeats}, line fit per direction; "
                   "the slower direction is used (contiguous copies: SGLang's page-scattered KV copies may be slower)"),
        "directions": fits,
        "points": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=None, help="the running SGLang server, e.g. http://127.0.0.1:30000")
    ap.add_argument("--out", type=Path, default=None, help="the profile JSON to write (or, with --swap-only, patch)")
    ap.add_argument("--name", default=None, help="profile name (default: the --out file's stem)")
    ap.add_argument("--quick", action="store_true", help="fewer measuring points")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--swap-only", action="store_true", help="measure only the host<->GPU swap")
    args = ap.parse_args(argv)

    if not args.swap_only:
        if not args.server or not args.out:
            ap.error("--server and --out are needed (or --swap-only)")
        from topas.fidelity.profile_server import profile_server

        device = ""
        try:
            import torch

            device = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
        except ImportError:
            pass
        profile_server(args.server, args.out, name=args.name, quick=args.quick, repeats=args.repeats, device=device)
    swap = measure_swap()
    if swap is None:
        print("no CUDA GPU visible to torch here: swap not measured", file=sys.stderr)
        return 0 if not args.swap_only else 1
    print(f"swap: {swap['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, latency {swap['latency_s'] * 1e6:.0f} us")
    if args.out is not None:
        profile = json.loads(args.out.read_text())
        profile["swap"] = swap
        args.out.write_text(json.dumps(profile, indent=2, sort_keys=True) + "\n")
        from topas.engine.cost import load_profile

        load_profile(args.out)  # still a valid profile
        print(f"wrote the measured swap into {args.out}")
    else:
        print(json.dumps(swap, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
