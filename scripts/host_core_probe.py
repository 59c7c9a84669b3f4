"""Whether the GPU host's slow phases are per vCPU or the whole machine's: one process hops over
every CPU it may run on (``os.sched_setaffinity``), a CPU every HOP seconds, and times the fixed
pure-Python workload of ``host_steal_probe`` there, plus one eager one-element CUDA add.

If at one moment some CPUs run the workload at full speed while others run it at half, the slow
phases belong to CPUs (a busy sibling thread, say) and a timing pinned to a fast CPU escapes them;
if all CPUs slow down together, pinning cannot help. Prints a row per sweep over the CPUs (each
CPU's median workload time in ms) and, at the end, the spread across CPUs within a sweep against
the spread of one CPU over time.

    python scripts/host_core_probe.py [SECONDS] [HOP]
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

from host_steal_probe import work   # this script's folder is on sys.path


def main(seconds: float = 45.0, hop: float = 0.05) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    x = torch.zeros(1, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sweeps, adds = [], []
    t_end = time.perf_counter() + seconds
    print(f"{len(cpus)} CPUs: {cpus}", flush=True)
    while time.perf_counter() < t_end:
        row, add_row = [], []
        for c in cpus:
            os.sched_setaffinity(0, {c})
            samples, t_hop = [], time.perf_counter() + hop
            while time.perf_counter() < t_hop:
                w0 = time.perf_counter()
                work()
                samples.append((time.perf_counter() - w0) * 1e3)
            torch.cuda.synchronize()
            e0.record()
            x.add_(1)
            e1.record()
            e1.synchronize()
            row.append(float(np.median(samples)))
            add_row.append(e0.elapsed_time(e1) * 1e3)
        sweeps.append(row)
        adds.append(add_row)
        t = seconds - (t_end - time.perf_counter())
        print(f"t={t:5.1f}s  " + " ".join(f"{v:5.2f}" for v in row) + "   add us " +
              " ".join(f"{v:4.0f}" for v in add_row), flush=True)
    os.sched_setaffinity(0, set(cpus))
    a, b = np.asarray(sweeps), np.asarray(adds)
    within = np.median(a.max(axis=1) / a.min(axis=1))
    over_time = np.median(a.max(axis=0) / a.min(axis=0))
    fast = a.min()
    print(f"{len(a)} sweeps over {len(cpus)} CPUs; workload max/min across CPUs within a sweep (median) "
          f"{within:.2f}, one CPU's max/min over time (median) {over_time:.2f}; share of (sweep, CPU) "
          f"samples within 10% of the fastest: {np.mean(a < 1.1 * fast):.1%}; sweeps with at least one CPU "
          f"within 10% of the fastest: {np.mean((a < 1.1 * fast).any(axis=1)):.1%}; eager add p10/p90 "
          f"{np.percentile(b, 10):.0f}/{np.percentile(b, 90):.0f} us")


if __name__ == "__main__":
    main(*(float(x) for x in sys.argv[1:3]))
