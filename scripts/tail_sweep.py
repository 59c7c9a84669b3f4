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

from attention_dev import check_config, input_sets, references
from kdtree import attention
from kdtree.bench.attention_sweep import SCALE
from kdtree.bench.timing import time_graphs

SHAPES = ["16,9,64,1024", "16,17,64,1024", "4,17,64,4096", "16,17,64,4096", "64,33,16,4096", "8,33,32,4096"]
COUNTS = 6


def _forced(head: int, tail_splits: int, fn):
    """``fn`` with ``launch_plan`` given the head/tail plan (head, tail_splits); (0, 0): uniform."""
    def call():
        keep = attention.choose_tail
        attention.choose_tail = lambda *_: (head, tail_splits)
        attention.launch_plan.cache_clear()
        try:
            fn()
        finally:
            attention.choose_tail = keep
            attention.launch_plan.cache_clear()
    return call


def _rotating(sets, pl, tree, out):
    """One fused call on the pair kernel a call, the input sets in turn (cold L2 inside a graph)."""
    it = iter(range(1 << 30))

    def call():
        q, kv = sets[next(it) % len(sets)]
        attention._run_cuda("fused", q, kv, pl, tree, SCALE, *out, impl="pair")
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
    plans = [(0, 0)] + [(plan.head, ts) for ts in sorted({*counts[::step], plan.tail_splits})]
    out = (torch.empty(B, N, H, attention.D_V, dtype=torch.bfloat16, device="cuda"),
           torch.empty(B, N, H, dtype=torch.float32, device="cuda"))
    refs = references(tree, pl, *sets[0])
    calls = []
    for head, ts in plans:
        _forced(head, ts, lambda: attention._run_cuda("fused", *sets[0], pl, tree, SCALE, *out, impl="pair"))()
        _, wrong = check_config(refs, out)
        if wrong:
            raise AssertionError(f"{shape} head={head} tail_splits={ts}: {wrong}")
        calls.append(_forced(head, ts, _rotating(sets, pl, tree, out)))
    n = len(sets) * max(1, 8 // len(sets))
    times = time_graphs(calls, reps=15, calls_per_graph=n, warmup=2, l2="cold")
    rt = B * -(-(N * H) // attention._FUSED_BM)
    rows = []
    for (head, ts), t in zip(plans, times):
        model = attention.launch_tiles(rt, P + N, sms, plan.splits, head, ts)
        rows.append(dict(B=B, N=N, H=H, P=P, splits=plan.splits, head=head, tail_splits=ts, us=t.median_us,
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
