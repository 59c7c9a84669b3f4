"""What the host's slow phases are (GPU host): a fixed pure-Python workload timed over and over
for SECONDS, each time with its wall time, its thread CPU time, the CPUs' steal time from
/proc/stat and this process's run-queue wait from /proc/self/schedstat, plus one eager
one-element CUDA add (CUDA events, the GPU idle before it).

If a slow phase is CPU time taken by the hypervisor (steal), wall time rises while thread CPU
time does not; if the vCPU itself runs slower (clock, shared caches), both rise. Prints a line
per second and the correlation at the end.

    PYTHONPATH=. python scripts/host_steal_probe.py [SECONDS]
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch


def steal_jiffies() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs, from /proc/stat."""
    f = open("/proc/stat").readline().split()[1:]
    v = [int(x) for x in f]
    return v[7], sum(v)


def run_delay_ns() -> int:
    """Nanoseconds this process waited on a run queue (/proc/self/schedstat, field 2)."""
    return int(open("/proc/self/schedstat").read().split()[1])


def cpu_mhz() -> float:
    """Mean of the "cpu MHz" lines of /proc/cpuinfo (what the guest is told; nan if absent)."""
    v = [float(line.split(":")[1]) for line in open("/proc/cpuinfo") if line.startswith("cpu MHz")]
    return float(np.mean(v)) if v else float("nan")


def work() -> float:
    s = 0.0
    for i in range(20000):
        s += i * 0.5
    return s


def main(seconds: float = 40.0) -> None:
    x = torch.zeros(1, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows, t_end, last = [], time.perf_counter() + seconds, time.perf_counter()
    per_s = []
    while time.perf_counter() < t_end:
        st0, tot0 = steal_jiffies()
        rd0, w0, c0 = run_delay_ns(), time.perf_counter(), time.thread_time()
        work()
        w1, c1, rd1 = time.perf_counter(), time.thread_time(), run_delay_ns()
        st1, tot1 = steal_jiffies()
        torch.cuda.synchronize()
        e0.record()
        x.add_(1)
        e1.record()
        e1.synchronize()
        rows.append(((w1 - w0) * 1e3, (c1 - c0) * 1e3, (rd1 - rd0) / 1e6, st1 - st0, tot1 - tot0,
                     e0.elapsed_time(e1) * 1e3))
        per_s.append(rows[-1])
        if w1 - last >= 1.0:
            a = np.asarray(per_s)
            steal = a[:, 3].sum() / max(a[:, 4].sum(), 1)
            print(f"t={w1 - t_end + seconds:5.1f}s  work wall {np.median(a[:, 0]):6.2f} ms  cpu {np.median(a[:, 1]):6.2f} ms  "
                  f"runq {a[:, 2].sum():6.1f} ms  steal {steal:5.1%}  eager add {np.median(a[:, 5]):6.1f} us  "
                  f"{cpu_mhz():.0f} MHz", flush=True)
            per_s, last = [], w1
    a = np.asarray(rows)
    print(f"{len(a)} samples; wall/cpu median {np.median(a[:, 0] / a[:, 1]):.3f}, "
          f"corr(wall, cpu) {np.corrcoef(a[:, 0], a[:, 1])[0, 1]:.2f}, corr(wall, eager add) "
          f"{np.corrcoef(a[:, 0], a[:, 5])[0, 1]:.2f}; wall p10/p90 {np.percentile(a[:, 0], 10):.2f}/"
          f"{np.percentile(a[:, 0], 90):.2f} ms, cpu p10/p90 {np.percentile(a[:, 1], 10):.2f}/"
          f"{np.percentile(a[:, 1], 90):.2f} ms")


if __name__ == "__main__":
    main(*(float(x) for x in sys.argv[1:2]))
