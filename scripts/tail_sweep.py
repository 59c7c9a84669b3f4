"""Head/tail launches timed against their tail split count (GPU host), the data a fit of
``choose_tail``'s model needs (``perf_tables.py tail-fit`` has only one tail count a shape).

    PYTHONPATH=.:scripts python scripts/tail_sweep.py OUT.csv [B,N,H,P ...]

At each shape (default: six of the H100 grid's head/tail shapes, P <= 4096) the ``fused`` call on
the pair kernel under its uniform plan and under head/tail plans with the head ``choose_tail``
picks and up to ``COUNTS`` tail split counts, each forced by standing in for ``choose_tail``
while its graph is captured; every plan checked against float64 (first and last sequence), then
all timed alternating (graph replay, cold L2: input sets rotating over 2.5x the L2). One row per
plan: its measured time and ``launch_tiles``' modelled one, in KV tile periods.
"""
from __future__ import annotations

import sys

import pandas as pd
import torch

from attention_dev import check_config, forced_plan, input_sets, references
from kdtree import attention
from kdtree.bench.attention_sweep import SCALE
from kdtree.bench.timing import time_graphs

SHAPES = ["16,9,64,1024", "16,17,64,1024", "4,17,64,4096", "16,17,64,4096", "64,33,16,4096", "8,33,32,4096"]
COUNTS = 6


def _rotating(sets, pl, tree, out):
    """One fused call on the pair kernel a call (its split count forced where given), the input
    sets in turn (cold L2 inside a graph)."""
    it = iter(range(1 << 30))

    def call(splits=None):
        q, kv = sets[next(it) % len(sets)]
        attention._run_cuda("fused", q, kv, pl, tree, SCALE, *out, splits=splits, impl="pair")
    return call


def sweep(shape: str, gen: torch.Generator) -> list[dict]:
    B, N, H, P = (int(v) for v in shape.split(","))
    sms = attention._num_sms(0)
    tree, pl, sets = input_sets(B, N, H, P, gen, torch.cuda.get_device_properties(0).L2_cache_size)
    plan = attention.launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms, impl="pair")
    if not plan.head:
        print(f"{shape}: no head/tail plan on {sms} SMs", flush=True)
        return []
    tiles = -(-(P + N) // attention._FUSED_BN)
    counts = range(plan.splits + 1, min(attention._MAX_SPLITS, tiles) + 1)
    step = max(1, -(-len(counts) // COUNTS))
    rt = B * -(-(N * H) // attention._FUSED_BM)
    uniform = attention.choose_splits(rt, P + N, sms, B * N * H)
    plans = [(uniform, 0, 0)] + [(plan.splits, plan.head, ts) for ts in sorted({*counts[::step], plan.tail_splits})]
    out = (torch.empty(B, N, H, attention.D_V, dtype=torch.bfloat16, device="cuda"),
           torch.empty(B, N, H, dtype=torch.float32, device="cuda"))
    refs = references(tree, pl, *sets[0])
    calls = []
    for p in plans:
        forced_plan(p, lambda s: attention._run_cuda("fused", *sets[0], pl, tree, SCALE, *out, splits=s, impl="pair"))()
        _, wrong = check_config(refs, out)
        if wrong:
            raise AssertionError(f"{shape} (splits, head, tail_splits)={p}: {wrong}")
        calls.append(forced_plan(p, _rotating(sets, pl, tree, out)))
    n = len(sets) * max(1, 8 // len(sets))
    times = time_graphs(calls, reps=15, calls_per_graph=n, warmup=2, l2="cold")
    rows = []
    for (s, head, ts), t in zip(plans, times):
        model = attention.launch_tiles(rt, P + N, sms, s, head, ts)
        rows.append(dict(B=B, N=N, H=H, P=P, splits=s, head=head, tail_splits=ts, us=t.median_us,
                         p20=t.p20_us, p80=t.p80_us, model_tiles=model, sm_clock_mhz=t.sm_clock_mhz))
        print(f"{shape} head={head:4d} tail_splits={ts:2d}: {t.median_us:8.1f} us [{t.p20_us:.1f}, {t.p80_us:.1f}]"
              f"  model {model:6.1f} tiles", flush=True)
    sets.clear()
    torch.cuda.empty_cache()
    return rows


def main(out_csv: str, *shapes: str) -> None:
    gen = torch.Generator().manual_seed(7)
    rows = [r for s in shapes or SHAPES for r in sweep(s, gen)]
    if not rows:
        sys.exit("no head/tail plan at any shape")
    pd.DataFrame(rows).to_csv(out_csv, index=False)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
