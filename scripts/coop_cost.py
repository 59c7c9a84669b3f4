"""What a cooperative launch costs the pair kernel, beside the in-kernel split merge (GPU host).

    PYTHONPATH=. python scripts/coop_cost.py B,N,H,P ...

At each shape: the split launch alone (fp32 partials, no merge) as a plain and as a cooperative
launch, and the call that merges in the launch; graph replay, one call a replay on a flushed L2
(graph1) and ten calls a replay on a warm one (graph10). Prints one line per shape.
"""
import sys
import torch
import kdtree.kernels as K
from kdtree import attention
from kdtree.bench.attention_sweep import SCALE, make_sets
from kdtree.bench.timing import time_graph

real_launch = K.launch


def coop_launch(*a, **kw):
    kw["cooperative"] = True
    return real_launch(*a, **kw)


def measure(shape: str, gen: torch.Generator) -> str:
    B, N, H, P = map(int, shape.split(","))
    dev = torch.device("cuda")
    tree, pl, sets = make_sets(B, N, H, P, 1, dev, gen)
    q, kv = sets[0]
    plan = attention.launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=kv.shape[1], num_sms=132, impl="pair")
    out = (torch.empty(B, N, H, 512, dtype=torch.bfloat16, device=dev),
           torch.empty(B, N, H, dtype=torch.float32, device=dev))
    o_part = torch.empty((plan.splits, B, N * H, 512), dtype=torch.float32, device=dev)
    lse_part = torch.empty((plan.splits, B, N * H), dtype=torch.float32, device=dev)
    sl = SCALE * attention._LOG2E

    def split():
        attention._launch_fused("pair", "rows_m", 64, q, kv, pl, tree.visibility, *out, o_part, lse_part, plan.splits,
                                0, 0, sl)

    def split_coop():
        K.launch = coop_launch
        try:
            split()
        finally:
            K.launch = real_launch

    def merged():
        attention._run_cuda("fused", q, kv, pl, tree, SCALE, *out, impl="pair")

    res = {}
    for name, fn in (("split", split), ("split_coop", split_coop), ("merged", merged)):
        for mode, cpg in (("graph1", 1), ("graph10", 10)):
            t = time_graph(fn, reps=30, calls_per_graph=cpg, warmup=3, l2="cold" if cpg == 1 else "warm")
            res[f"{name}_{mode}"] = t.median_us
    return f"{shape} {plan.splits} " + " ".join(f"{k}={v:.1f}" for k, v in res.items())


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    for arg in sys.argv[1:]:
        print(measure(arg, g), flush=True)
