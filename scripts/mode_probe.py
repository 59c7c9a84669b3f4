"""Per-call times of ``fused`` and ``cascade`` at a few shapes, each call beside the SM clock and
the reasons the driver gives for holding it down (GPU host).

    python scripts/mode_probe.py OUT.csv [B,N,H,P ...] [--calls 150] [--configs fused cascade fused:9]

At long prefixes the per-call times of one kernel spread over two levels about 10% apart, so the
median of a few repetitions lands on either, and a comparison of two configurations timed one
after the other can come out either way. This probe asks whether the SM clock is what moves: at
each shape it checks both variants against float64 (first and last sequence), then alternates
them call by call, each a one-call CUDA graph on a flushed L2, queued behind a hold as
``kdtree.bench.timing`` does. While a call is queued or running it reads, through NVML, the SM
clock and the clock-event reasons (power cap, thermal, ...). ``--configs`` names what alternates
(default ``fused cascade``; ``fused:S`` runs fused on S splits). One CSV row per call; a table last:
per shape and variant the median, p20 and p80, and the median time of the calls at the top clock
against those below it.
"""
from __future__ import annotations

import argparse
import csv
import sys

import numpy as np
import torch

from attention_dev import check_config, input_sets, references, run_config

from kdtree.bench.timing import L2Flush, hold_cycles_for, hold_device

SHAPES = ["8,65,8,32768", "64,9,8,32768", "1,513,64,32768", "16,65,64,32768"]


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return lambda: (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), int(reasons(h)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("shapes", nargs="*", default=SHAPES)
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--configs", nargs="+", default=["fused", "cascade"])
    a = ap.parse_args()
    configs = {}
    for c in a.configs:
        v, _, s = c.partition(":")
        if v not in ("fused", "cascade") or (s and not s.isdigit()):
            ap.error(f"--configs: expected fused, cascade or fused:S, got {c!r}")
        configs[c] = (v, int(s) if s else None)
    read = _nvml()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator().manual_seed(6)
    flush = L2Flush()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["shape", "config", "call", "us", "sm_mhz", "reasons"])
        for shape in a.shapes:
            B, N, H, P = (int(v) for v in shape.split(","))
            tree, pl, sets = input_sets(B, N, H, P, gen, l2)
            q, kv = sets[0]
            ref = references(tree, pl, q, kv)
            graphs = {}
            for c, (v, splits) in configs.items():
                o = (torch.empty(B, N, H, 512, dtype=torch.bfloat16, device="cuda"),
                     torch.empty(B, N, H, dtype=torch.float32, device="cuda"))
                run_config(v, tree, pl, q, kv, o, splits=splits, impl="pair")
                _, wrong = check_config(ref, o)
                if wrong:
                    sys.exit(f"{shape} {c}: {wrong}")
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run_config(v, tree, pl, q, kv, o, splits=splits, impl="pair")
                for _ in range(3):
                    g.replay()
                graphs[c] = (g, hold_cycles_for(g.replay))
            for i in range(a.calls):
                for v in configs:
                    g, hold = graphs[v]
                    flush()
                    hold_device(hold)
                    start.record()
                    g.replay()
                    end.record()
                    mhz, why = read()   # the hold or the call is on the GPU now
                    end.synchronize()
                    us = start.elapsed_time(end) * 1e3
                    w.writerow([shape, v, i, f"{us:.2f}", mhz, why])
                    rows.append((shape, v, us, mhz, why))
            del graphs, sets, q, kv, ref
            torch.cuda.empty_cache()
    print(f"{'shape':>16} {'config':>8} {'median':>9} {'p20':>9} {'p80':>9} {'top clock: n, median':>22} "
          f"{'below: n, median':>18} {'power-capped':>12}")
    for shape in a.shapes:
        sel = [r for r in rows if r[0] == shape]
        top = max(r[3] for r in sel)
        for v in configs:
            t = np.array([r[2] for r in sel if r[1] == v])
            hi = np.array([r[2] for r in sel if r[1] == v and r[3] >= top - 15])
            lo = np.array([r[2] for r in sel if r[1] == v and r[3] < top - 15])
            cap = sum(1 for r in sel if r[1] == v and r[4] & 0x4)   # SW power cap
            print(f"{shape:>16} {v:>8} {np.median(t):9.1f} {np.percentile(t, 20):9.1f} {np.percentile(t, 80):9.1f} "
                  f"{len(hi):>10}, {np.median(hi) if len(hi) else float('nan'):9.1f} "
                  f"{len(lo):>6}, {np.median(lo) if len(lo) else float('nan'):9.1f} {cap:>12}")


if __name__ == "__main__":
    main()
