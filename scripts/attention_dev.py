"""Kernel-development timing of verify_attention's fused kernels on one GPU (not the benchmark).

At each shape (B, N, H, P): fresh random inputs (a random tree with all N nodes real, every
prefix P), input sets rotating over more than 2.5x the L2 (cold L2), every configuration first
checked against the float64 reference on the first and last sequence, then timed under CUDA-graph
replay (median and p20-p80 of per-call times). Prints us, TFLOP/s (useful FLOPs), TB/s (minimal
bytes: each KV row once, q read, out and lse written), the fraction of the measured dense bf16
rate and HBM bandwidth, and the launch plan (layout, tile rows, splits).

    python scripts/attention_dev.py --out /tmp/dev.csv [--splits]

``--profile B,N,H,P[;B,N,H,P...]`` instead runs, at each shape, the fused kernel once per
``--kernels`` impl:layout pair between ``cudaProfilerStart`` and ``cudaProfilerStop`` (after a
checked warm-up), for Nsight Compute with ``--profile-from-start off`` (``scripts/gpu_attention.sh``
with ``NCU_SHAPE``, ``scripts/verify_table.py --ncu``).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import math
import sys

import torch

from kdtree.attention import (D_QK, D_V, _num_sms, _run_cuda, errors, launch_plan, random_parents,
                              reference_attention, verify_attention)
from kdtree.bench.attention_sweep import _slice_tree, make_sets
from kdtree.bench.timing import time_graphs
from kdtree.tree import Tree

SCALE = 1 / math.sqrt(192)
SHAPES = [(64, 9, 8, 16384), (8, 65, 8, 32768), (8, 33, 16, 16384), (1, 33, 64, 4096), (4, 129, 64, 16384),
          (8, 17, 8, 16384), (8, 9, 32, 16384)]


def ceilings() -> tuple[float, float, float]:
    """(HBM bandwidth in B/s, dense bf16 matmul FLOP/s, the SM clock in MHz during the matmul),
    measured now, as the project's roofline takes them (``kdtree.bench.ceilings``): the bandwidth
    the best of its read / write / copy probes over 2 GiB, the rate ``torch.mm`` 8192^3 on random
    data timed behind a device hold (the wgmma probe's reference). An 8192^3 matmul replayed after
    a second of matmuls read 690 TFLOP/s where this reads 789 in the same call on an H200
    (``results/verify_table_h200/49e9c69`` against ``results/wgmma_probe_h200/49e9c69.txt``):
    fractions against it read high. A call that draws enough power to lower the SM clock has a
    lower roof at its own clock."""
    from kdtree.bench.ceilings import _matmul_rate, measure_ceilings

    rate, mhz = _matmul_rate(8192, torch.bfloat16, "cuda", reps=20)
    torch.cuda.empty_cache()
    return measure_ceilings(quick=True).hbm_bw, rate, mhz


def cost(B, N, H, P, tree) -> tuple[float, float]:
    """(useful FLOPs, minimal bytes) of one call."""
    vis = tree.visibility
    bits = ((vis[..., None] >> torch.arange(64, device=vis.device)) & 1).sum(dim=(2, 3))  # [B, N]
    flops = 2 * (D_QK + D_V) * float((bits + P).sum()) * H
    return flops, float(B * (P + N) * D_QK * 2 + B * N * H * (D_QK * 2 + D_V * 2 + 4))


def configs(B, N, H, P, sms, sweep_splits):
    """(label, variant, impl, layout, splits) to time at a shape: the automatic plan, the wgmma
    kernel in each layout, the tma kernel (the default is tma_seq), cascade, and with ``sweep_splits`` split
    counts around the chosen one."""
    auto = launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms)
    out = [("fused", "fused", None, None, None), ("fused_rows_m", "fused", "wgmma", "rows_m", None)]
    if auto.layout != "rows_n":
        out.append(("fused_rows_n", "fused", "wgmma", "rows_n", None))
    out += [("fused_tma", "fused", "tma", None, None), ("cascade", "cascade", None, None, None)]
    if sweep_splits:
        for s in sorted({max(1, auto.splits // 2), auto.splits * 2, auto.splits + 1} - {auto.splits}):
            out.append((f"fused_s{s}", "fused", None, None, s))
    return out


def input_sets(B, N, H, P, gen, l2_bytes, max_sets=24):
    """(tree, prefix_lens, [(q, kv), ...]) on the GPU: the sweep's ``make_sets`` (a fresh random
    tree with all N nodes real, every prefix P) with enough input sets to rotate over more than
    2.5x the L2 (cold L2), at most ``max_sets``."""
    set_bytes = B * N * H * D_QK * 2 + B * (P + N) * D_QK * 2
    n_sets = max(1, min(max_sets, math.ceil(2.5 * l2_bytes / set_bytes)))
    return make_sets(B, N, H, P, n_sets, torch.device("cuda"), gen)


def references(tree, pl, q, kv):
    """float64 references of the first and the last sequence: {b: (out, lse)}."""
    return {b: reference_attention(q[b:b + 1], kv[b:b + 1], pl[b:b + 1], _slice_tree(tree, b), SCALE)
            for b in sorted({0, q.shape[0] - 1})}


def forced_plan(plan: tuple[int, int, int], fn):
    """``fn`` with a fused pair call's plan forced to ``plan`` = (splits, head, tail_splits)
    (``launch_plan``'s fields): head/tail by standing in for ``choose_tail`` while ``fn`` runs,
    uniform (head 0) by forcing the split count (which also keeps ``choose_tail`` out)."""
    from kdtree import attention

    def call():
        keep = attention.choose_tail
        attention.choose_tail = lambda *_: plan
        attention.launch_plan.cache_clear()
        try:
            fn(None if plan[1] else plan[0])
        finally:
            attention.choose_tail = keep
            attention.launch_plan.cache_clear()
    return call


@contextlib.contextmanager
def tail_knobs(min_gain: str = "", costs: str = ""):
    """``choose_tail``'s threshold (``MIN_GAIN``, a number in [0, 1)) and ``launch_tiles``'
    constants (``COSTS``, "block,partial,combine[,growth]" in KV tile periods, each at least 0; the
    growth 0 where not given) as given on a command line ("" keeps the one in use), set while the
    block runs, ``launch_plan``'s cache cleared on the way in and out; a bad value exits with one
    line naming it."""
    from kdtree import attention as A

    names = ("_TAIL_MIN_GAIN", "_BLOCK_TILES", "_PARTIAL_TILES", "_COMBINE_TILES", "_COMBINE_GROWTH")
    keep = tuple(getattr(A, n) for n in names)
    try:
        gain = float(min_gain) if min_gain else keep[0]
    except ValueError:
        gain = -1.0
    if not 0.0 <= gain < 1.0:
        sys.exit(f"MIN_GAIN must be a number in [0, 1), got {min_gain!r}")
    try:
        new = tuple(float(c) for c in costs.split(",")) if costs else keep[1:]
    except ValueError:
        new = ()
    if len(new) not in (3, 4) or min(new) < 0:
        sys.exit(f"COSTS must be three or four numbers at least 0, block,partial,combine[,growth], got {costs!r}")
    for n, v in zip(names, (gain, *new, 0.0)):
        setattr(A, n, v)
    A.launch_plan.cache_clear()
    try:
        yield
    finally:
        for n, v in zip(names, keep):
            setattr(A, n, v)
        A.launch_plan.cache_clear()


def run_config(variant, tree, pl, q, kv, out, splits=None, impl=None, layout=None):
    """One call of a variant into ``out`` (``torch`` through verify_attention, the rest through
    ``_run_cuda``)."""
    if variant == "torch":
        verify_attention(q, kv, pl, tree, SCALE, "torch", out=out, check_values=False)
    else:
        _run_cuda(variant, q, kv, pl, tree, SCALE, *out, splits=splits, impl=impl, layout=layout)


def check_config(refs, out) -> tuple[float, str]:
    """(worst relative error, "" or what failed) of ``out`` against the float64 references."""
    worst = 0.0
    for b, ref in refs.items():
        rel, le, same = errors(out[0][b:b + 1], out[1][b:b + 1], *ref)
        if not (rel <= 1e-2 and le <= 1e-3 and same):
            return float("nan"), f"WRONG at b={b}: rel={rel:.2e} lse={le:.2e} inf_ok={same}"
        worst = max(worst, rel)
    return worst, ""


def time_config(variant, tree, pl, sets, out, splits=None, impl=None, layout=None, reps=15, max_calls=8):
    """Graph-replay timing of a variant, rotating over the input sets inside the graph (cold L2)."""
    return time_configs([(variant, impl)], tree, pl, sets, out, splits, layout, reps, max_calls)[0]


def time_configs(configs, tree, pl, sets, out, splits=None, layout=None, reps=15, max_calls=8):
    """``time_config`` of several (variant, impl) pairs, or (variant, impl, splits) triples (their
    own split counts), their replays alternating (``kdtree.bench.timing.time_graphs``): the timings
    to compare, in order."""
    n_sets = len(sets)

    def caller(variant, impl, s=splits):
        it = iter(range(1 << 30))

        def call():
            q, kv = sets[next(it) % n_sets]
            run_config(variant, tree, pl, q, kv, out, s, impl, layout)
        return call

    return time_graphs([caller(*c) for c in configs], reps=reps,
                       calls_per_graph=n_sets * max(1, max_calls // n_sets), warmup=2 if reps > 5 else 1, l2="cold")


def profile(shapes, kernels=(("wgmma", "rows_m"), ("wgmma", "rows_n"))) -> int:
    """At each (B, N, H, P) of ``shapes``, one call of the fused kernel per (impl, layout) of
    ``kernels`` inside the profiler range, each checked first (first sequence vs float64);
    1 if a check failed."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(5)
    for B, N, H, P in shapes:
        tree = Tree.from_parents(random_parents(B, N, torch.full((B,), N), gen).to(dev))
        pl = torch.full((B,), P, dtype=torch.int32, device=dev)
        q = torch.randn(B, N, H, D_QK, device=dev).to(torch.bfloat16)
        kv = torch.randn(B, P + N, D_QK, device=dev).to(torch.bfloat16)
        out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device=dev),
               torch.empty(B, N, H, dtype=torch.float32, device=dev))
        refs = {0: references(tree, pl, q, kv)[0]}
        for impl, layout in kernels:
            for _ in range(3):
                _run_cuda("fused", q, kv, pl, tree, SCALE, *out, impl=impl, layout=layout)
            worst, wrong = check_config(refs, out)
            print(f"B={B} N={N} H={H} P={P} {impl} {layout}: {wrong or f'rel={worst:.2e} ok'}", flush=True)
            if wrong:
                return 1
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for impl, layout in kernels:
            _run_cuda("fused", q, kv, pl, tree, SCALE, *out, impl=impl, layout=layout)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return 0


def write_rows(path, rows) -> None:
    """``rows`` (dicts with the same keys) as a CSV at ``path``, the first row's keys the header."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """``"B,N,H,P;B,N,H,P"`` -> [(B, N, H, P), ...]."""
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/attention_dev.csv")
    ap.add_argument("--splits", action="store_true", help="also time split counts around the chosen one")
    ap.add_argument("--profile", metavar="B,N,H,P[;B,N,H,P...]",
                    help="profile one call per kernel at these shapes instead")
    ap.add_argument("--kernels", default="wgmma:rows_m,wgmma:rows_n",
                    help="impl:layout pairs that --profile runs (default: the wgmma kernel in both layouts)")
    a = ap.parse_args(argv)
    if a.profile:
        return profile(parse_shapes(a.profile), tuple(tuple(k.split(":")) for k in a.kernels.split(",")))
    dev = torch.device("cuda")
    sms, l2 = _num_sms(0), torch.cuda.get_device_properties(0).L2_cache_size
    bw, rate, _ = ceilings()
    print(f"{torch.cuda.get_device_name(0)}: {sms} SMs, L2 {l2 >> 20} MiB, HBM {bw / 1e12:.2f} TB/s, "
          f"bf16 {rate / 1e12:.0f} TFLOP/s", flush=True)
    gen = torch.Generator().manual_seed(12)
    rows, ok = [], True
    for B, N, H, P in SHAPES:
        tree, pl, sets = input_sets(B, N, H, P, gen, l2)
        out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device=dev),
               torch.empty(B, N, H, dtype=torch.float32, device=dev))
        flops, nbytes = cost(B, N, H, P, tree)
        refs = references(tree, pl, *sets[0])
        for label, variant, impl, layout, splits in configs(B, N, H, P, sms, a.splits):
            plan = launch_plan(variant, batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms,
                               impl=impl or "wgmma", splits=splits, layout=layout)
            out[0].fill_(float("nan"))
            run_config(variant, tree, pl, *sets[0], out, splits, impl, layout)
            worst, wrong = check_config(refs, out)
            if wrong:
                print(f"  {label}: {wrong}", flush=True)
                ok = False
                continue
            tm = time_config(variant, tree, pl, sets, out, splits, impl, layout)
            t = tm.median_us * 1e-6
            row = dict(B=B, N=N, H=H, P=P, config=label, layout=plan.layout, tile_rows=plan.tile_rows,
                       splits=plan.splits, us=tm.median_us, p20=tm.p20_us, p80=tm.p80_us,
                       tflops=flops / t / 1e12, tbps=nbytes / t / 1e12, frac_bf16=flops / t / rate,
                       frac_hbm=nbytes / t / bw, rel_err=worst, sets=len(sets))
            rows.append(row)
            print(f"B={B:3d} N={N:4d} H={H:3d} P={P:6d} {label:18s} {plan.layout:6s} tile {plan.tile_rows:2d} "
                  f"splits {plan.splits:2d}: {tm.median_us:8.1f} us [{tm.p20_us:.1f}, {tm.p80_us:.1f}] "
                  f"{row['tflops']:6.1f} TFLOP/s ({row['frac_bf16']:.2f}) {row['tbps']:5.2f} TB/s "
                  f"({row['frac_hbm']:.2f})", flush=True)
        sets.clear()
        torch.cuda.empty_cache()
    write_rows(a.out, rows)
    print(f"\nHBM {bw / 1e12:.2f} TB/s, bf16 {rate / 1e12:.0f} TFLOP/s; graph replay, cold L2, median us")
    print(f"{'B':>3s} {'N':>4s} {'H':>3s} {'P':>6s} {'config':18s} {'layout':6s} {'tile':>4s} {'spl':>3s} "
          f"{'us':>8s} {'bf16':>5s} {'hbm':>5s}")
    for r in rows:
        print(f"{r['B']:3d} {r['N']:4d} {r['H']:3d} {r['P']:6d} {r['config']:18s} {r['layout']:6s} "
              f"{r['tile_rows']:4d} {r['splits']:3d} {r['us']:8.1f} {r['frac_bf16']:5.2f} {r['frac_hbm']:5.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
