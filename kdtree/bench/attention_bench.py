"""Benchmark of verify_attention on a GPU: ceilings, correctness, then every variant timed.

One run: measure HBM copy bandwidth and the dense bf16 matmul rate (torch) as the roofs; at each
point check every variant against a float64 reference on fresh random inputs (first and last
sequence), then time it with CUDA events (eager, L2 flushed before each call) and CUDA-graph
replay (calls over rotating input sets that together exceed the L2, so it stays cold). Writes a
tidy table with ``save_table`` and prints a short summary last.

FLOP model: 2 * (576 + 512) per (query row x head x visible KV token), visible = prefix + the
node's ancestors and itself. Minimal bytes: each KV row read once (576 bf16), q read, out and lse
written. Attainable time = max(FLOPs / bf16 rate, bytes / copy bandwidth); the larger term is
the binding roof, and ``roof_fraction`` = attainable / measured.

    python -m kdtree.bench.attention_bench --out results/verify_attention_h200
"""
from __future__ import annotations

import argparse
import math
import time

import pandas as pd
import torch

from kdtree.attention import (D_QK, D_V, _run_cuda, choose_splits, errors, fused_impl, random_parents,
                              reference_attention, verify_attention)
from kdtree.bench import ceilings
from kdtree.bench.results import run_metadata, save_table
from kdtree.bench.timing import time_events, time_graph
from kdtree.tree import Tree

SCALE = 1 / math.sqrt(192)
# (B, N, H, P): the compute-bound grid, then the memory-bound point (one TP-8 shard).
POINTS = [(B, N, 64, P) for B in (1, 16) for P in (4096, 16384) for N in (33, 65, 257)]
POINTS.append((64, 9, 8, 16384))
# fused_mma: the fused variant forced onto the mma.sync kernel (where fused runs wgmma), for comparison.
VARIANTS = ("fused", "fused_mma", "cascade", "naive", "torch")
SKIP_MS = 40.0  # naive / torch predicted slower than this per call are not timed at that point


def measure_ceilings(device) -> dict:
    """The run's measured ceilings (``kdtree.bench.ceilings``) under the keys this table uses:
    HBM copy bandwidth (read + write), dense bf16 matmul rate, L2 size, SM count."""
    c = ceilings.measure_ceilings(device=str(torch.device(device).type))
    props = torch.cuda.get_device_properties(device)
    return {"copy_bw": c.hbm_bw, "bf16_flops": c.tensor_flops, "l2_bytes": props.L2_cache_size,
            "sms": props.multi_processor_count}


def cost(B, N, H, P, tree) -> tuple[float, float]:
    """(useful FLOPs, minimal bytes) of one call."""
    vis = tree.visibility
    bits = ((vis[..., None] >> torch.arange(64, device=vis.device)) & 1).sum(dim=(2, 3))  # [B, N]
    visible = float((bits + P).sum()) * H
    flops = 2 * (D_QK + D_V) * visible
    nbytes = B * (P + N) * D_QK * 2 + B * N * H * (D_QK * 2 + D_V * 2 + 4)
    return flops, float(nbytes)


def make_sets(B, N, H, P, n_sets, device, gen):
    """Input sets sharing one random tree (DDTree-like random recursive trees, all N nodes real)."""
    parents = random_parents(B, N, torch.full((B,), N), gen)
    tree = Tree.from_parents(parents.to(device))
    pl = torch.full((B,), P, dtype=torch.int32, device=device)
    sets = [(torch.randn(B, N, H, D_QK, device=device).to(torch.bfloat16),
             torch.randn(B, P + N, D_QK, device=device).to(torch.bfloat16)) for _ in range(n_sets)]
    return tree, pl, sets


def _slice_tree(tree, b):
    return Tree(tree.tokens[b:b + 1], tree.parents[b:b + 1], tree.depth[b:b + 1],
                tree.num_nodes[b:b + 1], tree.visibility[b:b + 1], tree.draft_depth)


def call(variant, q, kv, pl, tree):
    """One call of a variant (``fused_mma``: fused on the mma.sync kernel); returns (out, lse)."""
    if variant != "fused_mma":
        return verify_attention(q, kv, pl, tree, SCALE, variant, check_values=False)
    B, N, H, _ = q.shape
    out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device=q.device),
           torch.empty(B, N, H, dtype=torch.float32, device=q.device))
    _run_cuda("fused", q, kv, pl, tree, SCALE, *out, impl="mma")
    return out


def check(variant, q, kv, pl, tree) -> tuple[float, float]:
    """Worst (out rel error, lse abs error) over the first and last sequence vs float64."""
    out, lse = call(variant, q, kv, pl, tree)
    worst = (0.0, 0.0)
    for b in sorted({0, q.shape[0] - 1}):
        ref = reference_attention(q[b:b + 1], kv[b:b + 1], pl[b:b + 1], _slice_tree(tree, b), SCALE)
        rel, le, same_inf = errors(out[b:b + 1], lse[b:b + 1], *ref)
        if not (rel <= 1e-2 and le <= 1e-3 and same_inf):
            raise AssertionError(f"{variant} wrong at b={b}: rel={rel:.3e} lse={le:.3e} inf_ok={same_inf}")
        worst = (max(worst[0], rel), max(worst[1], le))
    return worst


def predicted_ms(variant, B, N, H, P, flops) -> float:
    """Rough per-call time used only to skip hopeless timings (naive: per-head L2 re-reads)."""
    if variant == "naive":
        return B * N * H * (P + N) * D_QK * 2 / 3e12 * 1e3
    if variant == "torch":
        return flops / 25e12 * 1e3
    return 0.0  # fused and cascade are timed at every point


def bench_point(B, N, H, P, ceil, gen, device, rows, variants):
    set_bytes = B * N * H * D_QK * 2 + B * (P + N) * D_QK * 2
    n_sets = max(1, min(24, math.ceil(2.5 * ceil["l2_bytes"] / set_bytes)))
    tree, pl, sets = make_sets(B, N, H, P, n_sets, device, gen)
    flops, nbytes = cost(B, N, H, P, tree)
    t_flop, t_byte = flops / ceil["bf16_flops"], nbytes / ceil["copy_bw"]
    bound = "compute" if t_flop >= t_byte else "memory"
    blocks = -(-(N * H) // 64) * B
    for v in variants:
        if v == "fused_mma" and fused_impl(device.index or 0) == "mma":
            continue  # fused already runs the mma.sync kernel
        kernel = ("mma" if v == "fused_mma" else fused_impl(device.index or 0)) if v in (
            "fused", "fused_mma", "cascade") else v
        base = dict(variant=v, kernel=kernel, B=B, N=N, H=H, P=P, flops=flops, bytes=nbytes, bound=bound,
                    splits=choose_splits(blocks, P + N, ceil["sms"]) if v in ("fused", "fused_mma") else
                    choose_splits(blocks, P, ceil["sms"]) if v == "cascade" else None,
                    sets=n_sets)
        est = predicted_ms(v, B, N, H, P, flops)
        if est > SKIP_MS:
            rows.append(base | dict(mode="skipped", l2="cold", note=f"predicted {est:.0f} ms per call"))
            print(f"  {v:8s} skipped (predicted {est:.0f} ms)", flush=True)
            continue
        try:
            rel, le = check(v, *sets[0], pl, tree)
        except AssertionError as e:  # wrong: not timed
            rows.append(base | dict(mode="failed", l2="cold", note=str(e)))
            print(f"  {v:8s} FAILED the check: {e}", flush=True)
            continue
        it = iter(range(1 << 30))
        fns = [lambda s=s: call(v, s[0], s[1], pl, tree) for s in sets]

        def rotating():
            return fns[next(it) % len(fns)]()

        t0 = time_events(fns[:1], reps=3, warmup=1).median_us
        reps = int(min(200, max(5, 0.3e6 / t0)))
        timings = [time_events(fns, reps=reps, warmup=2, l2="cold")]
        per_graph = len(fns) * max(1, min(8, int(2e3 / (t0 * len(fns)))))
        g_reps = int(min(50, max(3, 0.3e6 / (t0 * per_graph))))
        timings.append(time_graph(rotating, reps=g_reps, calls_per_graph=per_graph, warmup=1))
        for tm in timings:
            t = tm.median_us * 1e-6
            rows.append(base | dict(mode=tm.mode, l2="cold", median_us=tm.median_us, p20_us=tm.p20_us,
                                    p80_us=tm.p80_us, reps=tm.reps, tflops=flops / t / 1e12,
                                    tbps=nbytes / t / 1e12, roof_fraction=max(t_flop, t_byte) / t,
                                    check_rel=rel, check_lse=le, note=""))
        g = rows[-1]
        print(f"  {v:8s} eager {timings[0].median_us:9.1f} us  graph {g['median_us']:9.1f} us  "
              f"{g['tflops']:6.1f} TFLOP/s {g['tbps']:5.2f} TB/s  roof {g['roof_fraction']:.2f} ({bound})  "
              f"err {rel:.1e}/{le:.1e}", flush=True)
    del sets
    torch.cuda.empty_cache()


def summary(df: pd.DataFrame, ceil: dict) -> str:
    g = df[df["mode"] == "graph"].set_index(["variant", "B", "N", "H", "P"])
    lines = ["", f"ceilings: copy {ceil['copy_bw'] / 1e12:.2f} TB/s, bf16 matmul {ceil['bf16_flops'] / 1e12:.0f} TFLOP/s",
             f"{'variant':8s} {'B':>3s} {'N':>4s} {'H':>4s} {'P':>6s} {'graph us':>10s} {'eager us':>10s} "
             f"{'TFLOP/s':>8s} {'TB/s':>6s} {'roof':>5s} bound"]
    e = df[df["mode"] == "eager"].set_index(["variant", "B", "N", "H", "P"])["median_us"]
    for key, r in g.iterrows():
        lines.append(f"{key[0]:8s} {key[1]:3d} {key[2]:4d} {key[3]:4d} {key[4]:6d} {r['median_us']:10.1f} "
                     f"{e.get(key, float('nan')):10.1f} {r['tflops']:8.1f} {r['tbps']:6.2f} "
                     f"{r['roof_fraction']:5.2f} {r['bound']}")
    lines.append("targets:")
    fz = g.xs("fused")
    for (B, N, H, P), r in fz.iterrows():
        if H == 64:
            frac = r["tflops"] * 1e12 / ceil["bf16_flops"]
            lines.append(f"  fused B={B} N={N} P={P}: {frac:.2f} of bf16 rate (target >= 0.35) "
                         f"{'MET' if frac >= 0.35 else 'MISSED'}")
        else:
            frac = r["tbps"] * 1e12 / ceil["copy_bw"]
            lines.append(f"  fused B={B} N={N} H={H} P={P}: {frac:.2f} of copy bandwidth (target >= 0.70) "
                         f"{'MET' if frac >= 0.70 else 'MISSED'}")
        for other in ("cascade", "fused_mma"):
            if (other, B, N, H, P) in g.index:
                c = g.loc[(other, B, N, H, P), "median_us"]
                lines.append(f"    vs {other}: {c / r['median_us']:.2f}x {'ok' if c >= r['median_us'] else 'SLOWER'}")
    key = (1, 33, 64, 4096)
    for v, target in (("naive", 20), ("torch", 5)):
        if (v, *key) in g.index and key in fz.index:
            ratio = g.loc[(v, *key), "median_us"] / fz.loc[key, "median_us"]
            lines.append(f"  fused vs {v} at B=1 N=33 P=4096 (graph): {ratio:.1f}x (target >= {target}x) "
                         f"{'MET' if ratio >= target else 'MISSED'}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/verify_attention_h200")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="only the first point (smoke test)")
    a = ap.parse_args(argv)
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(int(time.time()))
    ceil = measure_ceilings(device)
    print(f"ceilings: copy {ceil['copy_bw'] / 1e12:.2f} TB/s, bf16 {ceil['bf16_flops'] / 1e12:.0f} TFLOP/s, "
          f"L2 {ceil['l2_bytes'] >> 20} MiB, {ceil['sms']} SMs", flush=True)
    rows = []
    for B, N, H, P in (POINTS[:1] if a.quick else POINTS):
        print(f"B={B} N={N} H={H} P={P}", flush=True)
        bench_point(B, N, H, P, ceil, gen, device, rows, a.variants.split(","))
    df = pd.DataFrame(rows)
    meta = run_metadata() | {f"ceiling_{k}": v for k, v in ceil.items()}
    path = save_table(df, a.out, meta)
    print(f"wrote {path}")
    print(summary(df, ceil))


if __name__ == "__main__":
    main()
