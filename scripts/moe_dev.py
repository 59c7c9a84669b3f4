"""Development sweep of the grouped-GEMM kernel shapes and the router's parts on one GPU.

Usage: PYTHONPATH=. python3 scripts/moe_dev.py   (prints tables; one device call)

For the kimi_k2_ep8 MoE layer under its own router at T in (1, 17, 65, 257, 1025): every
(token tiles nt, warps splitting K, ring depth) of ``CANDIDATES`` for the gate/up and the down
GEMM, each first checked against torch's grouped GEMM on the same rows (bf16 output within
2^-7 of the largest magnitude, float32 within 2^-8: torch rounds its output to bf16), then timed by graph replay; the fraction
of the measured HBM bandwidth is the distinct experts' bytes over the time. Then the router's
parts (float32 GEMM, sigmoid, top-k, renormalisation) timed alone.
"""
import torch
import torch.nn.functional as F

from kdtree import experts as ek
from kdtree.bench.ceilings import measure_ceilings
from kdtree.bench.moe import moe_layer
from kdtree.bench.timing import time_graph
from kdtree.engine.config import get_config

CANDIDATES = [(1, 4, 4), (1, 4, 5), (1, 4, 6), (1, 8, 3), (1, 8, 4), (2, 4, 4), (2, 4, 5), (2, 8, 3),
              (4, 4, 3), (4, 4, 4), (4, 8, 2), (4, 8, 3)]
c = measure_ceilings(quick=True)
print(c.caption(), flush=True)
moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
E, h, d = moe.w1.shape
rows = []
for T in (1, 17, 65, 257, 1025):
    x = torch.randn(T, d, device="cuda").to(torch.bfloat16)
    weight, expert = moe.route(x)
    offs, rowidx, pos = ek.permute(expert, E)
    distinct = int(expert[expert < E].unique().numel())
    xs = x[rowidx.long()]
    ref_g = torch._grouped_mm(xs, moe.w1.transpose(-2, -1), offs=offs)
    ref_u = torch._grouped_mm(xs, moe.w3.transpose(-2, -1), offs=offs)
    ref_h = (F.silu(ref_g.float()) * ref_u.float())
    hid = ref_h.to(torch.bfloat16)
    ref_y = torch._grouped_mm(hid, moe.w2.transpose(-2, -1), offs=offs).float()
    n = int(offs[-1])
    for nt, ks, st in CANDIDATES:
        for gated in (True, False):
            try:
                if gated:
                    fn = lambda: ek.grouped_gemm(x, moe.w1, offs, T * 8, up=moe.w3, rowidx=rowidx, nt=nt,  # noqa: E731
                                                 shape=(ks, st))
                    ref, bound, nbytes = ref_h, 2 ** -7, distinct * 2 * h * d * 2
                else:
                    fn = lambda: ek.grouped_gemm(hid, moe.w2, offs, T * 8, nt=nt, shape=(ks, st))  # noqa: E731
                    ref, bound, nbytes = ref_y, 2 ** -8, distinct * h * d * 2
            except ValueError as exc:
                print("skip", nt, ks, st, exc)
                continue
            got = fn()[:n].float()
            err = float((got - ref[:n]).abs().max() / ref[:n].abs().max().clamp_min(1e-30)) if n else 0.0
            ok = err <= bound
            t = time_graph(fn, reps=10, calls_per_graph=3) if ok else None
            rows.append(dict(T=T, gemm="gate_up" if gated else "down", nt=nt, ksplit=ks, stages=st,
                             err=err, us=t.median_us if t else float("nan"),
                             hbm=nbytes / (t.median_us * 1e-6) / c.hbm_bw if t else float("nan")))
    torch_t = time_graph(lambda: (torch._grouped_mm(xs, moe.w1.transpose(-2, -1), offs=offs),
                                  torch._grouped_mm(xs, moe.w3.transpose(-2, -1), offs=offs)), reps=10,
                         calls_per_graph=3)
    rows.append(dict(T=T, gemm="gate_up", nt=0, ksplit=0, stages=0, err=0.0, us=torch_t.median_us,
                     hbm=distinct * 2 * h * d * 2 / (torch_t.median_us * 1e-6) / c.hbm_bw))
    torch_t = time_graph(lambda: torch._grouped_mm(hid, moe.w2.transpose(-2, -1), offs=offs), reps=10,
                         calls_per_graph=3)
    rows.append(dict(T=T, gemm="down", nt=0, ksplit=0, stages=0, err=0.0, us=torch_t.median_us,
                     hbm=distinct * h * d * 2 / (torch_t.median_us * 1e-6) / c.hbm_bw))
    xf = x.float()
    s = F.linear(xf, moe.gate.weight)
    w16 = moe.gate.weight.to(torch.bfloat16)
    parts = {"route": lambda: moe.route(x), "linear_f32": lambda: F.linear(xf, moe.gate.weight),
             "linear_bf16": lambda: F.linear(x, w16), "sigmoid": lambda: torch.sigmoid(s),
             "topk": lambda: s.topk(8, dim=-1)}
    print(T, {k: round(time_graph(f, reps=10, calls_per_graph=3).median_us, 1) for k, f in parts.items()},
          flush=True)
import pandas as pd  # noqa: E402

df = pd.DataFrame(rows)
pd.set_option("display.width", 200)
print(df.pivot_table(index=["gemm", "nt", "ksplit", "stages"], columns="T", values="hbm").round(3).to_string())
print("max err", df.err.max(), "failed", df[df.us.isna()][["T", "gemm", "nt", "ksplit", "stages", "err"]].to_string())
