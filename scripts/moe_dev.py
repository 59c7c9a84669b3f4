"""Development sweep of the router kernel's shapes on one GPU, beside the torch router's parts.

Usage: PYTHONPATH=. python3 scripts/moe_dev.py   (prints tables; one device call)

For the kimi_k2_ep8 MoE layer's router (dim 7168, 384 experts, top 8) at T in (1, 17, 65, 257,
1025): ``kdtree.experts.route`` with every (experts per block, tokens per block) of ``SHAPES``,
each first checked against the float64 reference (each token's k ids a top k of the float64
scores within 1e-5, the weights within 1e-5 of the float64 renormalisation of the chosen
ones), then timed by graph replay (warm L2: the 11 MB gate stays resident); the torch router
(float32 GEMM, sigmoid, top-k, renormalisation) and its parts timed the same way. The HBM
fraction is the gate's bytes over the time (an upper bound on what the gate's stream costs).
"""
import pandas as pd
import torch
import torch.nn.functional as F

from kdtree import experts as ek
from kdtree.bench.ceilings import measure_ceilings
from kdtree.bench.moe import moe_layer
from kdtree.bench.timing import time_graph
from kdtree.engine.config import get_config

SHAPES = [(2, 8), (4, 8), (2, 64), (4, 64)]
c = measure_ceilings(quick=True)
print(c.caption(), flush=True)
moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
gate, k, scale = moe.gate.weight, moe.k, float(moe.scale)
gate_bytes = gate.numel() * 4
rows = []
for T in (1, 17, 65, 257, 1025):
    x = torch.randn(T, gate.shape[1], device="cuda").to(torch.bfloat16)
    s64 = torch.sigmoid(x.double() @ gate.double().T)
    for shape in [None] + SHAPES:
        w, e = ek.route(x, gate, k, scale, shape=shape)
        chosen = s64.gather(1, e)
        ok = bool((chosen.amin(1) >= s64.scatter(1, e, -1.0).amax(1) - 1e-5).all()) and bool(
            torch.allclose(w.double(), chosen / chosen.sum(1, keepdim=True) * scale, atol=1e-5 * scale))
        t = time_graph(lambda x=x, shape=shape: ek.route(x, gate, k, scale, shape=shape), reps=20, calls_per_graph=5) if ok else None
        rows.append(dict(T=T, router="kernel", shape="default" if shape is None else f"{shape[0]}x{shape[1]}",
                         ok=ok, us=t.median_us if t else float("nan")))
    moe.backend = "torch"
    xf = x.float()
    sc = F.linear(xf, gate)
    parts = {"torch route": lambda x=x: moe.route(x), "linear_f32": lambda xf=xf: F.linear(xf, gate),
             "sigmoid": lambda sc=sc: torch.sigmoid(sc), "topk": lambda sc=sc: sc.topk(k, dim=-1)}
    for name, fn in parts.items():
        rows.append(dict(T=T, router="torch", shape=name, ok=True,
                         us=time_graph(fn, reps=20, calls_per_graph=5).median_us))
    moe.backend = "auto"
df = pd.DataFrame(rows)
df["gate_hbm_fraction"] = gate_bytes / (df.us * 1e-6) / c.hbm_bw
pd.set_option("display.width", 200)
print(df.pivot_table(index=["router", "shape"], columns="T", values="us", sort=False).round(1).to_string())
print(df.pivot_table(index=["router", "shape"], columns="T", values="gate_hbm_fraction", sort=False).round(3).to_string())
print("failed checks:", df[~df.ok][["T", "shape"]].to_string() if (~df.ok).any() else "none")
