"""The tensor-core rate of the verify kernels' wgmma steps in isolation (GPU host, sm_90a).

Runs ``cuda/wgmma_probe.cu`` in each mode (S alone on one or both warpgroups, P V alone on one
or both, both warpgroups doing S then P V), one block per SM, each timed by CUDA-graph replay
(behind a device hold), and prints TFLOP/s, the fraction of the dense bf16 rate measured in the
same process (``torch.mm`` 8192^3), and the cycles one warpgroup spends per step (mode 5: S with
its four rope k-steps taking Q from registers, against mode 1's all-shared-memory S). The last line
is what a 64-row tile's tensor work (S by one warpgroup, P V by both) takes at these rates, to
set against the ~2.9 us per tile of the `tma` kernel at B = 1, N = 257, H = 64, P = 4096.

Then the rows_n layout's two products (KV tokens on M, N query rows on N; modes 6 and 7, both
warpgroups) at N = 8 .. 72, with the cycles one m64nNk16 takes against the cycles its FLOPs take
at the dense rate: whether a block holding all 72 rows of an H = 8, N = 9 sequence on N (instead of
two 64-row tiles on M) could run near the dense rate, which the shards' HBM bar needs on an H200
(``perf_tables.py hbm-bar``).

    PYTHONPATH=. python scripts/wgmma_probe.py [ITERS]
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from kdtree.bench.ceilings import _matmul_rate
from kdtree.bench.timing import time_graph
from kdtree.kernels import get_kernel, launch, ptr

S_FLOP = 2 * 64 * 64 * 576     # one S step of one warpgroup: 64 rows x 64 KV columns x 576
PV_FLOP = 2 * 64 * 256 * 64    # one P V step of one warpgroup: 64 rows x 256 value columns x 64 KV rows


def probe_smem(rows: int = 64) -> int:
    """Shared memory of the probe with ``rows`` rows of Q and of P: Q, one KV tile, P, alignment slack."""
    return rows * 576 * 2 + 64 * 576 * 2 + rows * 64 * 2 + 1024


SMEM = probe_smem()
N_MODES = {6: ("S^T = K Q^T, both warpgroups", 36), 7: ("O^T = V^T P^T, half each", 16)}  # m64nNk16 a step
N_WIDTHS = (8, 16, 32, 64, 72)
MODES = {0: ("S, one warpgroup", S_FLOP), 1: ("S, both warpgroups", 2 * S_FLOP),
         2: ("P V, one warpgroup", PV_FLOP), 3: ("P V, both warpgroups", 2 * PV_FLOP),
         4: ("S then P V, both warpgroups", 2 * (S_FLOP + PV_FLOP)),
         5: ("S, rope k-steps from registers", 2 * S_FLOP)}


def main(iters: int = 2000) -> None:
    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rate, _ = _matmul_rate(8192, torch.bfloat16, "cuda", reps=20)
    out = torch.zeros(256, device="cuda")
    print(f"{torch.cuda.get_device_name(dev)}: {sms} SMs, dense bf16 {rate / 1e12:.0f} TFLOP/s (torch.mm, now); "
          f"{iters} steps per warpgroup, one block per SM, CUDA-graph replay")
    per_sm = {}
    for mode, (what, flop_per_iter) in MODES.items():
        fn = get_kernel("wgmma_probe", "wgmma_probe", {"PROBE_MODE": mode}, compiler="nvcc")
        run = lambda fn=fn: launch(fn, (sms,), (256,), (ptr(out), np.int32(iters)), shared_mem=SMEM)  # noqa: E731
        t = time_graph(run, reps=20, calls_per_graph=1)
        secs = t.median_us * 1e-6
        flops = flop_per_iter * iters * sms / secs
        per_sm[mode] = flops / sms
        cycles = secs * t.sm_clock_mhz * 1e6 / iters
        print(f"mode {mode} {what:28s} {t.median_us:9.1f} us  {flops / 1e12:6.1f} TFLOP/s  {flops / rate:5.2f} of bf16  "
              f"{cycles:7.0f} cycles per step  ({t.sm_clock_mhz:.0f} MHz)")
    # A 64-row tile: one S and both warpgroups' P V, each step at its own SM-wide rate.
    s_us, pv_us = S_FLOP / per_sm[1] * 1e6, 2 * PV_FLOP / per_sm[3] * 1e6
    print(f"a 64-row tile's tensor work at these rates: S {s_us:.2f} us + P V {pv_us:.2f} us = {s_us + pv_us:.2f} us "
          f"(mode 4's mix: {(S_FLOP + 2 * PV_FLOP) / per_sm[4] * 1e6:.2f} us); at the dense rate "
          f"{(S_FLOP + 2 * PV_FLOP) / (rate / sms) * 1e6:.2f} us")
    print("rows_n products, both warpgroups: cycles per m64nNk16 of one warpgroup, against the cycles its FLOPs "
          "take at the dense rate with two warpgroups sharing the SM")
    for mode, (what, count) in N_MODES.items():
        for n in N_WIDTHS:
            fn = get_kernel("wgmma_probe", "wgmma_probe", {"PROBE_MODE": mode, "PROBE_N": n}, compiler="nvcc")
            smem = probe_smem(max(64, n))
            run = lambda fn=fn, smem=smem: launch(fn, (sms,), (256,), (ptr(out), np.int32(iters)), shared_mem=smem)  # noqa: E731
            tm = time_graph(run, reps=20, calls_per_graph=1)
            secs = tm.median_us * 1e-6
            flops = 2 * count * 2 * 64 * n * 16 * iters * sms / secs
            per_inst = secs * tm.sm_clock_mhz * 1e6 / iters / count
            dense_clk = rate / sms / (tm.sm_clock_mhz * 1e6)   # FLOPs an SM does a cycle at the dense rate
            print(f"mode {mode} {what:30s} N = {n:3d} {tm.median_us:9.1f} us  {flops / 1e12:6.1f} TFLOP/s  "
                  f"{flops / rate:5.2f} of bf16  {per_inst:6.1f} cycles per instruction, "
                  f"{2 * 2 * 64 * n * 16 / dense_clk:5.1f} at the dense rate")

if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:2]))
