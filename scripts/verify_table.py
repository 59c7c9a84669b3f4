"""The verify-attention benchmark table: every variant at every shape of the tree-verify grid.

Shapes: one GPU with H = 64 heads, N {9, 17, 33, 65, 129, 257, 513} x P {1024, 4096, 16384,
32768} x B {1, 4, 16}; tensor-parallel shards H {8, 16, 32}, N {9, 17, 33, 65} x P {4096, 16384,
32768} x B {1, 8, 64}. At each shape: fresh random inputs (a random tree with all N nodes real,
every prefix P; input sets rotating over more than 2.5x the L2 where they fit, the L2 flushed
before each replay: cold L2), every configuration checked against the float64 reference on the
first and the last sequence, then timed under CUDA-graph replay in two groups, the default
kernel and its baselines first, the other kernels after, each group's replays alternating
(median and p20-p80 of per-call times; fewer repetitions and calls per graph for long calls).
Timed one after the other on a power-capped GPU, configurations compared SM clock states as much
as kernels: the clock falls over seconds of heavy work (docs/perf_log.md, session 30). Variants:
``fused`` on the
default kernel (on sm_90a the one ``launch_plan`` picks for the launch, ``pair``, ``tma_seq`` or ``rn72``;
the column ``impl`` names it, ``default_impl`` the rule) and on each kernel (``fused_pair``,
``fused_tma_seq``, ``fused_tma``, ``fused_wgmma``, the first wgmma kernel, ``fused_mma``),
``cascade`` (default kernel),
``naive`` where its predicted time is short, ``torch`` where its float32 score matrices fit and
its predicted time is short (the ``skip`` column says why a variant was not run).

Columns: us, p20, p80, TFLOP/s (useful FLOPs), TB/s (minimal bytes: each KV row once, q, out and
lse), the fractions of the dense bf16 rate and the HBM bandwidth measured in the same run
(``attention_dev.ceilings``),
the binding roof (``bf16`` or ``hbm``: whichever floor is longer) and the fraction of it, the
launch plan (layout, tile rows, splits; a head/tail launch's head row tiles and tail splits), the
worst relative error of the check.

    KDTREE_GIT_SHA=$(git rev-parse HEAD) python scripts/verify_table.py --out results/verify_table_h200

runs the cheapest shapes first and writes ``<out>.csv`` row by row (a cut-off run keeps what it
measured), then, in the grid's order, ``<out>.parquet``,
``.csv`` and ``.meta.json`` (git sha, device, clocks sampled during the timed work, ceilings)
through ``kdtree.bench.results.save_table``; prints a short table last.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from attention_dev import (ceilings, check_config, cost, input_sets, references, run_config,  # noqa: E402
                           time_configs)
from kdtree.attention import D_V, _num_sms, default_impl, launch_plan  # noqa: E402

H64 = [(B, N, 64, P) for N in (9, 17, 33, 65, 129, 257, 513) for P in (1024, 4096, 16384, 32768)
       for B in (1, 4, 16)]
SHARDS = [(B, N, H, P) for H in (8, 16, 32) for N in (9, 17, 33, 65) for P in (4096, 16384, 32768)
          for B in (1, 8, 64)]
SHAPES = H64 + SHARDS

# (label, variant, impl); fused and cascade run the default fused kernel (fused: the one
# launch_plan picks for the launch, pair, tma_seq or rn72 on sm_90a).
CONFIGS = [("fused", "fused", None), ("cascade", "cascade", None), ("fused_pair", "fused", "pair"),
           ("fused_tma_seq", "fused", "tma_seq"), ("fused_wgmma", "fused", "wgmma"), ("fused_tma", "fused", "tma"),
           ("fused_mma", "fused", "mma"),
           ("naive", "naive", None), ("torch", "torch", None)]
OPTIONAL = ("fused_tma", "fused_mma")  # dropped first when the time budget runs short
ESSENTIAL = ("fused", "cascade")  # run even past the time budget
# Timed first, together, then the rest together; within each group the replays alternate. The
# default kernel, its baseline and its own kernel named are compared at the same SM clock, and the
# slower kernels (up to 4x the default's time), whose heat lowers the clock under the power cap,
# stay out of the default's window (docs/perf_log.md, session 30).
FIRST = ("fused", "cascade", "fused_pair")

NAIVE_MAX_US = 2000.0   # naive runs where its predicted time is below this
TORCH_MAX_US = 5000.0   # torch likewise, and where one sequence's float32 scores fit in TORCH_MAX_BYTES
TORCH_MAX_BYTES = 8 << 30


def naive_predicted_us(B, N, H, P) -> float:
    """The naive kernel's time from the earlier runs: ~13 TFLOP/s, and ~6 TB/s of L2 reads for
    the latent rows it re-reads per (query, head) (docs/perf_log.md, verify_attention)."""
    flops = 2 * (576 + 512) * (P + N) * N * H * B
    return max(flops / 13e12, B * N * H * (P + N) * 1152 / 6e12) * 1e6


def torch_predicted(B, N, H, P) -> tuple[float, float]:
    """(us, bytes of one sequence's float32 score matrix) of the torch variant: dense matmuls at
    ~40 TFLOP/s and ~12 passes over the scores at ~2 TB/s."""
    scores = N * H * (P + N) * 4
    us = B * (2 * N * H * (P + N) * (576 + 512) / 40e12 + 12 * scores / 2e12) * 1e6
    return us, scores


def skip_reason(label, B, N, H, P) -> str:
    """Why a variant is not run at a shape ("" when it is)."""
    if label == "naive":
        us = naive_predicted_us(B, N, H, P)
        return f"predicted {us / 1e3:.1f} ms > {NAIVE_MAX_US / 1e3:.0f} ms" if us > NAIVE_MAX_US else ""
    if label == "torch":
        us, nbytes = torch_predicted(B, N, H, P)
        if nbytes > TORCH_MAX_BYTES:
            return f"float32 scores of one sequence {nbytes / 2**30:.1f} GiB > {TORCH_MAX_BYTES >> 30} GiB"
        return f"predicted {us / 1e3:.1f} ms > {TORCH_MAX_US / 1e3:.0f} ms" if us > TORCH_MAX_US else ""
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/verify_table", help="output path without suffix")
    ap.add_argument("--budget", type=float, default=170.0,
                    help="seconds; past 85%% of it the optional variants are dropped, past it every variant "
                         "but fused and cascade")
    ap.add_argument("--shapes", help="B,N,H,P;... instead of the whole grid")
    ap.add_argument("--skip", default="", help="comma-separated config labels not to run (recorded as skipped)")
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    dev = torch.device("cuda")
    sms, l2 = _num_sms(0), torch.cuda.get_device_properties(0).L2_cache_size
    bw, rate, rate_mhz = ceilings()
    auto = default_impl(0)   # None: the sm_90a kernel chosen per launch
    default = "pair|tma_seq|rn72" if auto is None else auto
    print(f"{torch.cuda.get_device_name(0)}: {sms} SMs, L2 {l2 >> 20} MiB, HBM {bw / 1e12:.2f} TB/s, "
          f"bf16 {rate / 1e12:.0f} TFLOP/s; fused runs {default} by default", flush=True)
    shapes = SHAPES
    if a.shapes:
        from attention_dev import parse_shapes
        shapes = parse_shapes(a.shapes)
    # Cheapest shapes first, so that a run that reaches its time budget has every variant at all
    # but the longest shapes; the table is written in the grid's order.
    index = {shape: i for i, shape in enumerate(shapes)}
    shapes = sorted(shapes, key=lambda s: s[0] * s[1] * s[2] * (s[3] + s[1]))
    gen = torch.Generator().manual_seed(2026)
    out_csv = Path(a.out).with_suffix(".csv")
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    rows, ok, writer = [], True, None
    with open(out_csv, "w", newline="") as f:
        for B, N, H, P in shapes:
            tree, pl, sets = input_sets(B, N, H, P, gen, l2, max_sets=48)
            out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device=dev),
                   torch.empty(B, N, H, dtype=torch.float32, device=dev))
            flops, nbytes = cost(B, N, H, P, tree)
            floor_bf16, floor_hbm = flops / rate, nbytes / bw
            roof = "bf16" if floor_bf16 >= floor_hbm else "hbm"
            refs = references(tree, pl, *sets[0])
            est = flops / (0.4 * rate)  # seconds per fused call, roughly
            reps, max_calls = (10, 8) if est < 1e-3 else (5, 1) if est < 10e-3 else (3, 1)
            jobs, pending = [], []   # checked configurations not yet timed, and their rows
            for label, variant, impl in CONFIGS:
                plan = (launch_plan(variant, batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms,
                                    impl=impl or auto) if variant != "torch" else None)
                row = dict(B=B, N=N, H=H, P=P, config=label, variant=variant,
                           impl=(plan.impl if plan else "torch"), default_impl=default,
                           layout=plan.layout if plan else "", tile_rows=plan.tile_rows if plan else 0,
                           splits=plan.splits if plan else 1, tail_splits=plan.tail_splits if plan else 0,
                           head=plan.head if plan else 0, us=math.nan, p20=math.nan, p80=math.nan,
                           tflops=math.nan, tbps=math.nan, frac_bf16=math.nan, frac_hbm=math.nan, roof=roof,
                           frac_roof=math.nan, rel_err=math.nan, sets=len(sets), reps=0,
                           sm_clock_mhz=math.nan, skip="")
                elapsed = time.monotonic() - t_start
                skip = "--skip" if label in a.skip.split(",") else skip_reason(label, B, N, H, P)
                if not skip and elapsed > 0.85 * a.budget and label in OPTIONAL:
                    skip = f"time budget ({elapsed:.0f} s of {a.budget:.0f} s)"
                if not skip and elapsed > a.budget and label not in ESSENTIAL:
                    skip = f"time budget ({elapsed:.0f} s of {a.budget:.0f} s)"
                if not skip:
                    out[0].fill_(float("nan"))
                    run_config(variant, tree, pl, *sets[0], out, impl=impl)
                    worst, wrong = check_config(refs, out)
                    if wrong:
                        print(f"  B={B} N={N} H={H} P={P} {label}: {wrong}", flush=True)
                        ok = False
                        skip = wrong
                    else:
                        row["rel_err"] = worst
                        jobs.append((row, variant, impl))
                row["skip"] = skip
                pending.append(row)
            # The checked configurations of the shape, their replays alternating within each group.
            groups = [[j for j in jobs if j[0]["config"] in FIRST], [j for j in jobs if j[0]["config"] not in FIRST]]
            for group in filter(None, groups):
                tms = time_configs([(v, i) for _, v, i in group], tree, pl, sets, out, reps=reps, max_calls=max_calls)
                for (r, _, _), tm in zip(group, tms):
                    t = tm.median_us * 1e-6
                    r.update(us=tm.median_us, p20=tm.p20_us, p80=tm.p80_us, tflops=flops / t / 1e12,
                             tbps=nbytes / t / 1e12, frac_bf16=flops / t / rate, frac_hbm=nbytes / t / bw,
                             frac_roof=max(floor_bf16, floor_hbm) / t, reps=tm.reps, sm_clock_mhz=tm.sm_clock_mhz)
            for r in pending:
                rows.append(r)
                if writer is None:
                    writer = csv.DictWriter(f, fieldnames=list(r))
                    writer.writeheader()
                writer.writerow(r)
            f.flush()
            sets.clear()
            del refs, out
            torch.cuda.empty_cache()
            print(f"B={B:2d} N={N:3d} H={H:2d} P={P:5d} {roof} " + " ".join(
                f"{r['config'].replace('fused_', '')}={r['us']:.0f}" for r in rows[-len(CONFIGS):] if not r["skip"])
                + f" t={time.monotonic() - t_start:.0f}s", flush=True)
    meta_extra = dict(ceiling_hbm_bw=bw, ceiling_bf16_flops=rate, ceiling_bf16_clock_mhz=rate_mhz,
                      default_fused_impl=default,
                      timing="CUDA-graph replay, cold L2 (input sets rotating over > 2.5x L2 where at most 48 "
                             "fit; L2 flushed before each replay), fused, cascade and fused_pair alternating, then "
                             "the other configurations alternating, median "
                             "and p20-p80 of per-call times",
                      naive_rule=f"run where predicted < {NAIVE_MAX_US:.0f} us",
                      torch_rule=f"run where predicted < {TORCH_MAX_US:.0f} us and one sequence's float32 "
                                 f"scores < {TORCH_MAX_BYTES >> 30} GiB",
                      wall_s=time.monotonic() - t_start)
    rows.sort(key=lambda r: index[(r["B"], r["N"], r["H"], r["P"])])
    try:
        import pandas as pd

        from kdtree.bench.results import run_metadata, save_table

        save_table(pd.DataFrame(rows), Path(a.out).with_suffix(".parquet"), {**run_metadata(), **meta_extra})
    except Exception as e:  # the CSV written row by row stays
        print(f"save_table failed ({type(e).__name__}: {e}); {out_csv} holds the rows", flush=True)
    timed = [r for r in rows if not r["skip"] and r["variant"] != "torch" and r["config"] != "naive"]
    print(f"\nHBM {bw / 1e12:.2f} TB/s, bf16 {rate / 1e12:.0f} TFLOP/s; graph replay, cold L2, median us; "
          f"fraction of the binding roof")
    best = {}
    for r in timed:
        key = (r["B"], r["N"], r["H"], r["P"])
        best.setdefault(key, {})[r["config"]] = r
    print(f"{'B':>3s} {'N':>4s} {'H':>3s} {'P':>6s} roof {default:>14s} {'cascade':>14s} {'tma_seq':>9s} {'wgmma':>9s} "
          f"{'mma':>9s}")
    for (B, N, H, P), c in best.items():
        def cell(name, frac=True, c=c):
            r = c.get(name)
            if r is None:
                return "-"
            return f"{r['us']:.0f} ({r['frac_roof']:.2f})" if frac else f"{r['us']:.0f}"
        roof = next(iter(c.values()))["roof"]
        print(f"{B:3d} {N:4d} {H:3d} {P:6d} {roof:4s} {cell('fused'):>14s} {cell('cascade'):>14s} "
              f"{cell('fused_tma_seq', False):>9s} {cell('fused_wgmma', False):>9s} {cell('fused_mma', False):>9s}")
    print(f"wrong: {sum(1 for r in rows if r['skip'].startswith('WRONG'))}, skipped: "
          f"{sum(1 for r in rows if r['skip'] and not r['skip'].startswith('WRONG'))}, wall {time.monotonic() - t_start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
