"""Between-pass agreement of host and eager timings on this machine, with the timing settings of
the previous runs ("old": 3 host calls, no warm-up time, 30 eager calls), the current ones
("new") and the current ones with torch single-threaded around the host timings ("new1"),
passes alternating so all see the same machine drift; a pure-Python loop ("calib") shows it.

Prints the machine's CPU limits and, per setting, the share of timings whose two passes agree
within 5%. Usage: python scripts/host_timing_check.py [OUT.csv]
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import kdtree
from kdtree.bench import timing
from kdtree.bench.tree_bench import draft_inputs
from kdtree.tree import build_tree_reference


def _cpu_limits() -> str:
    """CPU count, cgroup quota and throttling, hypervisor steal (ticks), torch threads, load."""
    quota, stat = Path("/sys/fs/cgroup/cpu.max"), Path("/sys/fs/cgroup/cpu.stat")
    throttled = " ".join(ln for ln in stat.read_text().splitlines() if "throttled" in ln) if stat.exists() else "n/a"
    steal = Path("/proc/stat").read_text().splitlines()[0].split()[8] if Path("/proc/stat").exists() else "n/a"
    return (f"os.cpu_count={os.cpu_count()} affinity={len(os.sched_getaffinity(0))} "
            f"cgroup cpu.max={quota.read_text().strip() if quota.exists() else 'n/a'} ({throttled}) "
            f"steal={steal} torch threads={torch.get_num_threads()} loadavg={os.getloadavg()[0]:.2f}")


def _settings(name: str) -> dict:
    torch.set_num_threads(1 if name == "new1" else THREADS)
    if name == "old":
        timing.WARMUP_S = 0.0
        return {"host_reps": 3, "eager_reps": 30, "min_s": 0.0}
    timing.WARMUP_S = 0.01
    return {"host_reps": 3, "eager_reps": 100, "min_s": 0.25}


THREADS = torch.get_num_threads()


def one_pass(name: str, gpu: bool) -> dict:
    s = _settings(name)
    dev = torch.device("cuda" if gpu else "cpu")
    out = {"host calib python loop": timing.time_host(lambda: sum(range(20000)), reps=3, warmup=1, min_s=0.25).median_us}
    for b, n in ((1, 16), (1, 64), (1, 256), (8, 64), (8, 256)):
        lp, tok = draft_inputs(b, 15, n, torch.device("cpu"))
        for path in ("paper", "serving"):
            out[f"host build cpu_{path} B={b} n={n}"] = timing.time_host(
                lambda: build_tree_reference(lp, tok, n, path=path), reps=s["host_reps"], warmup=1, min_s=s["min_s"]).median_us
        if gpu:
            glp, gtok = lp.to(dev), tok.to(dev)
            fn = lambda: kdtree.build_tree(glp, gtok, n, validate=False)  # noqa: E731
            out[f"eager build B={b} n={n}"] = timing.time_events([fn], reps=s["eager_reps"]).median_us
    return out


def main(out_csv: str | None) -> None:
    gpu = torch.cuda.is_available()
    print(_cpu_limits(), flush=True)
    passes = []
    t0 = time.perf_counter()
    for name in ("old", "new", "new1") * 2:
        passes.append((name, one_pass(name, gpu)))
        print(f"pass {name}: calib {passes[-1][1]['host calib python loop']:.1f} us; {_cpu_limits()}", flush=True)
    rows = []
    for setting in ("old", "new", "new1"):
        a, b = [p for n, p in passes if n == setting]
        for k in a:
            rows.append({"setting": setting, "timing": k, "a_us": a[k], "b_us": b[k], "ratio": b[k] / a[k]})
    df = pd.DataFrame(rows)
    df["within_5pct"] = (df["ratio"] - 1).abs() <= 0.05
    df["kind"] = df["timing"].str.split().str[0]
    print(f"{time.perf_counter() - t0:.1f} s; {_cpu_limits()}")
    print(df.groupby(["kind", "setting"]).agg(n=("ratio", "size"), within_5pct=("within_5pct", "mean"),
                                             median_dev=("ratio", lambda r: float(np.median((r - 1).abs())))).to_string())
    if out_csv:
        df.to_csv(out_csv, index=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
