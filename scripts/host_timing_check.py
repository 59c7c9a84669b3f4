"""How reproducible host-dispatched timings are on this machine, and which way of taking them is
most reproducible: eager calls (CUDA events around a Python call) and host paths (the CPU tree
builds), each timed in cycles spread over the call, every cycle by two methods:

  blocked      the sweeps' way: all repetitions of a point back to back (100 eager calls with
               the floor interleaved; host paths 3 calls and on for 0.25 s)
  interleaved  ROUNDS rounds over all points, REPS_PER_ROUND repetitions of each per round

Every sample is written (OUT.parquet: cycle, method, point, round, us, floor_us, thread_us), with
a summary beside it (OUT.summary.parquet: per round and per timing, the statistics the
estimators need), so that estimators (the median, the low quartile, the minimum, the quietest
round's median, time over the floor) can be judged offline by how often two cycles agree
within 5%. A pure-Python loop is timed at every round (the host's speed over time), with the
process's involuntary context switches and the machine's steal ticks per cycle.

Usage: python scripts/host_timing_check.py OUT.parquet [CYCLES]   (on a GPU host)
       python scripts/host_timing_check.py --agreement OUT.summary.parquet
"""
from __future__ import annotations

import itertools
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import kdtree
from kdtree.bench import attention_sweep as av
from kdtree.bench.ceilings import trivial_ops
from kdtree.bench.timing import L2Flush, QuietGC, _event_samples, warm_up
from kdtree.bench.tree_bench import agreeing_target, draft_inputs
from kdtree.tree import build_tree_reference

ROUNDS, REPS_PER_ROUND = 10, 10


def _steal() -> int:
    return int(Path("/proc/stat").read_text().splitlines()[0].split()[8])


def eager_points(dev) -> dict:
    """name -> (calls, floor, cold): the eager calls of the default sweep's host-bound range."""
    gen = torch.Generator().manual_seed(0)   # random trees are drawn on the CPU
    floors, pts = trivial_ops(), {}
    for n, p in ((9, 4096), (33, 4096), (65, 512), (65, 4096)):
        for variant in ("fused", "cascade"):
            tree, pl, sets = av.make_sets(1, n, 64, p, 4, dev, gen)
            fns = [lambda s=s, v=variant, t=tree, pl=pl: av.call(v, *s, pl, t) for s in sets]
            vfloor = av.trivial_call(variant, dev, gen)[0]
            pts[f"{variant} N={n} P={p} warm"] = (fns[:1], vfloor, False)
            pts[f"{variant} N={n} P={p} cold"] = (fns, vfloor, True)
    for budget in (16, 64, 256):
        lp, tok = draft_inputs(1, 15, min(budget, 64), dev)
        pts[f"build B=1 n={budget}"] = ([lambda lp=lp, tok=tok, b=budget: kdtree.build_tree(lp, tok, b, validate=False)],
                                        floors["build_tree"], False)
        tree = kdtree.build_tree(lp, tok, budget)
        target = agreeing_target(tree)
        pts[f"accept n={budget}"] = ([lambda t=tree, g=target: kdtree.accept_tree(t, g, validate=False)],
                                     floors["accept_tree"], False)
    return pts


def host_points() -> dict:
    pts = {}
    for budget in (64, 128, 512):
        lp, tok = draft_inputs(1, 15, min(budget, 64), torch.device("cpu"))
        for path in ("paper", "serving"):
            pts[f"cpu_{path} n={budget}"] = lambda lp=lp, tok=tok, b=budget, p=path: build_tree_reference(lp, tok, b, path=p)
    pts["calib python loop"] = lambda: sum(range(20000))
    return pts


def time_eager(calls, floor, cold, reps, flush) -> list[tuple[float, float]]:
    """(call, floor) microseconds of ``reps`` eager calls, by the package's own sampling loop."""
    with QuietGC():
        pairs = _event_samples(calls, reps, 0, flush if cold else None, floor)
    return list(zip(*pairs))


def time_hostpath(fn, reps, min_s) -> list[tuple[float, float]]:
    out, end = [], time.perf_counter() + min_s
    with QuietGC():
        while len(out) < reps or time.perf_counter() < end:
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            out.append(((time.perf_counter() - t0) * 1e6, (time.thread_time() - c0) * 1e6))
    return out


def one_cycle(cycle: int, method: str, eager: dict, host: dict, flush, rows: list) -> None:
    def add(point, rnd, samples, kind):
        for a, b in samples:
            rows.append({"cycle": cycle, "method": method, "point": point, "round": rnd, "kind": kind, "us": a,
                         ("floor_us" if kind == "eager" else "thread_us"): b, "t": time.time()})

    rounds = 1 if method == "blocked" else ROUNDS
    for r in range(rounds):
        for name, (calls, floor, cold) in eager.items():
            if r == 0:
                warm_up(lambda calls=calls, floor=floor: (calls[0](), floor()), 3, sync=True)
            add(name, r, time_eager(calls, floor, cold, 100 if method == "blocked" else REPS_PER_ROUND, flush), "eager")
        for name, fn in host.items():
            if r == 0:
                warm_up(fn, 1)
            add(name, r, time_hostpath(fn, 3, 0.25) if method == "blocked" else time_hostpath(fn, 1, 0.025), "host")


def summarize_samples(df: pd.DataFrame) -> pd.DataFrame:
    """Per (cycle, method, kind, point): each round's median (``round`` >= 0) and the pooled
    statistics of all its samples (``round`` = -1): median, p25, minimum, floor and CPU-time
    medians, sample count."""
    def stats(g):
        return pd.Series({"median": g.us.median(), "p25": g.us.quantile(0.25), "min": g.us.min(), "n": len(g),
                          "floor": g.floor_us.median() if "floor_us" in g else np.nan,
                          "thread": g.thread_us.median() if "thread_us" in g else np.nan})
    keys = ["cycle", "method", "kind", "point"]
    rounds = df.groupby(keys + ["round"]).apply(stats, include_groups=False).reset_index()
    pooled = df.groupby(keys).apply(stats, include_groups=False).reset_index().assign(round=-1)
    return pd.concat([rounds, pooled], ignore_index=True)


def estimates(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (cycle, method, kind, point): the estimators judged, from ``summarize_samples``."""
    pooled = summary[summary["round"] < 0].set_index(["cycle", "method", "kind", "point"])
    rounds = summary[summary["round"] >= 0]
    quiet = rounds.loc[rounds.groupby(["cycle", "method", "kind", "point"])["median"].idxmin()]
    out = pooled[["median", "p25", "min"]].copy()
    out["quietest_round"] = quiet.set_index(["cycle", "method", "kind", "point"])["median"]
    out["over_floor"] = pooled["median"] / pooled["floor"]
    return out.reset_index()


def agreement(summary: pd.DataFrame, within: float = 0.05) -> pd.DataFrame:
    """Share of the pairs of cycles whose estimates of a point agree within ``within``, per
    method, kind and estimator."""
    est = estimates(summary)
    rows = []
    for (method, kind), g in est.groupby(["method", "kind"]):
        for col in ("median", "p25", "min", "quietest_round", "over_floor"):
            ok = tot = 0
            for _, gp in g.groupby("point"):
                v = gp.sort_values("cycle")[col].to_numpy()
                for i, j in itertools.combinations(range(len(v)), 2):
                    if np.isfinite(v[i]) and np.isfinite(v[j]):
                        tot += 1
                        ok += abs(v[j] / v[i] - 1) <= within
            if tot:
                rows.append({"method": method, "kind": kind, "estimator": col, "pairs": tot, "agree": ok / tot})
    return pd.DataFrame(rows)


def main() -> None:
    if sys.argv[1] == "--agreement":
        table = agreement(pd.read_parquet(sys.argv[2]))
        print(table.pivot_table(index=["method", "kind"], columns="estimator", values="agree").round(3).to_string())
        return
    out = Path(sys.argv[1])
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    dev = torch.device("cuda")
    eager, host, flush = eager_points(dev), host_points(), L2Flush()
    rows, log = [], []
    for c in range(cycles):
        for method in (("blocked", "interleaved") if c % 2 == 0 else ("interleaved", "blocked")):
            t0, s0, cs0 = time.time(), _steal(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
            one_cycle(c, method, eager, host, flush, rows)
            log.append(f"cycle {c} {method}: {time.time() - t0:.1f} s, steal ticks {_steal() - s0}, "
                       f"involuntary switches {resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - cs0}")
            print(log[-1], flush=True)
    df = pd.DataFrame(rows)
    prev = pd.read_parquet(out) if out.exists() else None
    if prev is not None:   # a second batch of cycles later in the same call
        df["cycle"] += prev["cycle"].max() + 1
        df = pd.concat([prev, df])
    df.to_parquet(out)
    summarize_samples(df).to_parquet(out.with_suffix(".summary.parquet"))


if __name__ == "__main__":
    main()
