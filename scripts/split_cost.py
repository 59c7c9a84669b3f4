"""What a split launch's combine costs (GPU host): at each shape, the fused verify call as it runs
(the split launch writing its partials, then ``verify_combine`` under programmatic dependent
launch), the split launch alone, and the combine alone on partials already written; each checked
first (the call against float64, and the two launches in turn bit for bit against the call), then
timed by CUDA-graph replay with the L2 flushed before each replay (one call a replay). The call
minus the split launch is what the combine adds to it; the combine alone is its cost where
nothing runs before it.

    PYTHONPATH=. python scripts/split_cost.py OUT.csv [B,N,H,P ...]

Writes one row per shape to OUT.csv and prints a short table.
"""
from __future__ import annotations

import csv
import sys

import torch

from kdtree import attention
from kdtree.bench.attention_sweep import SCALE, check, make_sets
from kdtree.bench.timing import time_graph

SHAPES = ["1,33,64,4096", "1,65,64,4096", "1,33,64,16384", "1,9,32,16384", "8,17,8,16384"]


def measure(B: int, N: int, H: int, P: int, gen: torch.Generator) -> dict | None:
    """The shape's row (None for a launch of one split, which has no combine)."""
    dev = torch.device("cuda")
    sms = attention._num_sms(0)
    tree, pl, sets = make_sets(B, N, H, P, 1, dev, gen)
    q, kv = sets[0]
    plan = attention.launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=kv.shape[1], num_sms=sms,
                                 impl=attention.default_impl(0))
    if plan.partial_slots == 0:
        print(f"B={B} N={N} H={H} P={P}: one split, no combine", flush=True)
        return None
    rel, _ = check("fused", q, kv, pl, tree)
    out = (torch.empty(B, N, H, attention.D_V, dtype=torch.bfloat16, device=dev),
           torch.empty(B, N, H, dtype=torch.float32, device=dev))
    o_part = torch.empty((plan.partial_slots, B, N * H, attention.D_V), dtype=attention.PARTIAL_DTYPE, device=dev)
    lse_part = torch.empty((plan.partial_slots, B, N * H), dtype=torch.float32, device=dev)
    scale_log2 = SCALE * attention._LOG2E

    def whole():
        attention._run_cuda("fused", q, kv, pl, tree, SCALE, *out)

    def split():
        attention._launch_fused(plan.impl, plan.layout, plan.tile_rows, q, kv, pl, tree.visibility, *out,
                                o_part, lse_part, plan.splits, 0, 0, scale_log2)

    def combine():
        attention._launch_combine(o_part, lse_part, *out)

    whole()
    ref = [t.clone() for t in out]
    for t in out:
        t.fill_(float("nan"))
    split()
    combine()
    torch.cuda.synchronize()
    if not all(torch.equal(a, b) for a, b in zip(out, ref)):
        raise AssertionError(f"B={B} N={N} H={H} P={P}: split + combine differ from the call")
    t = {name: time_graph(fn, reps=30, calls_per_graph=1, warmup=3, l2="cold")
         for name, fn in (("whole", whole), ("split", split), ("combine", combine))}
    row = dict(B=B, N=N, H=H, P=P, impl=plan.impl, splits=plan.splits, rel_err=rel,
               sm_clock_mhz=t["whole"].sm_clock_mhz, **{f"{k}_us": v.median_us for k, v in t.items()},
               **{f"{k}_p20": v.p20_us for k, v in t.items()}, **{f"{k}_p80": v.p80_us for k, v in t.items()})
    print(f"B={B} N={N} H={H} P={P} {plan.impl} splits={plan.splits}: call {row['whole_us']:.1f} us, split "
          f"launch {row['split_us']:.1f}, combine alone {row['combine_us']:.1f}, call - split "
          f"{row['whole_us'] - row['split_us']:.1f} at {row['sm_clock_mhz']:.0f} MHz", flush=True)
    return row


def main(out_csv: str, *shapes: str) -> None:
    gen = torch.Generator().manual_seed(0)
    rows = [r for text in shapes or SHAPES if (r := measure(*(int(x) for x in text.split(",")), gen)) is not None]
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: split_cost.py OUT.csv [B,N,H,P ...]")
    main(*sys.argv[1:])
