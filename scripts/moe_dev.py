"""Development sweep of the grouped-GEMM kernel shapes on one GPU.

Usage: PYTHONPATH=. python3 scripts/moe_dev.py [T,T,...]   (prints a table; one device call)

For the kimi_k2_ep8 MoE layer at T tokens (default 1, 17, 65) under its own router and under
Zipf routing (``kdtree.bench.moe.routing_ids``, exponent 1.2): every candidate (token tiles nt,
warps splitting K, ring depth, and for the down projection 16-row tiles per block) of
``CANDIDATES``, each first checked against torch's grouped GEMM on the same rows (bf16 output
within 2^-7 of the largest magnitude, float32 within 2^-8: torch rounds its output to bf16),
then timed by graph replay; ``hbm``: the distinct experts' bytes over the time, as a fraction of
the measured HBM bandwidth; ``plan`` marks what ``kdtree.experts.plan`` picks.
"""
import sys

import pandas as pd
import torch
import torch.nn.functional as F

from kdtree import experts as ek
from kdtree.bench.ceilings import measure_ceilings
from kdtree.bench.moe import moe_layer, routing_ids
from kdtree.bench.timing import time_graph
from kdtree.engine.config import get_config

# (nt, ksplit, stages, down tiles); the gate/up GEMM ignores the tiles.
CANDIDATES = [(1, 4, 4, 2), (1, 4, 4, 1), (1, 8, 3, 2), (1, 8, 3, 1), (1, 4, 6, 1), (2, 4, 4, 2), (2, 4, 4, 1),
              (2, 8, 3, 2), (4, 4, 3, 2), (4, 4, 3, 1)]
TOKENS = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 17, 65]
c = measure_ceilings(quick=True)
print(c.caption(), flush=True)
cfg = get_config("kimi_k2_ep8")
moe = moe_layer(cfg, "cuda", torch.bfloat16)
E, h, d = moe.w1.shape
sms = torch.cuda.get_device_properties(0).multi_processor_count
gen = torch.Generator().manual_seed(0)
rows = []
for T in TOKENS:
    x = torch.randn(T, d, generator=gen).to("cuda", torch.bfloat16)
    for routing in ("model", "zipf"):
        expert = moe.route(x)[1] if routing == "model" else \
            routing_ids("zipf", T, cfg.n_routed_experts, cfg.n_active_experts, generator=gen).to("cuda")
        offs, rowidx, pos = ek.permute(expert, E)
        distinct = int(expert[expert < E].unique().numel())
        hottest = int(torch.bincount(expert[expert < E].flatten(), minlength=E).max())
        xs = x[rowidx.long()]
        ref_h = F.silu(torch._grouped_mm(xs, moe.w1.transpose(-2, -1), offs=offs).float()) \
            * torch._grouped_mm(xs, moe.w3.transpose(-2, -1), offs=offs).float()
        hid = ref_h.to(torch.bfloat16)
        ref_y = torch._grouped_mm(hid, moe.w2.transpose(-2, -1), offs=offs).float()
        n = int(offs[-1])
        chosen = ek.plan(T, cfg.n_active_experts, cfg.n_routed_experts, E, d, sms)
        done = set()
        for nt, ks, st, tiles in CANDIDATES:
            for gated in (True, False):
                key = (gated, nt, ks, st, 2 if gated else tiles)
                if key in done:
                    continue
                done.add(key)
                if gated:
                    fn = lambda: ek.grouped_gemm(x, moe.w1, offs, T * 8, up=moe.w3, rowidx=rowidx, nt=nt,  # noqa: E731
                                                 shape=(ks, st))
                    ref, bound, nbytes = ref_h, 2 ** -7, distinct * 2 * h * d * 2
                else:
                    fn = lambda: ek.grouped_gemm(hid, moe.w2, offs, T * 8, nt=nt, shape=(ks, st),  # noqa: E731
                                                 tiles=tiles)
                    ref, bound, nbytes = ref_y, 2 ** -8, distinct * h * d * 2
                got = fn()[:n].float()
                err = float((got - ref[:n]).abs().max() / ref[:n].abs().max().clamp_min(1e-30)) if n else 0.0
                t = time_graph(fn, reps=10, calls_per_graph=3) if err <= bound else None
                rows.append(dict(T=T, routing=routing, distinct=distinct, hottest=hottest,
                                 gemm="gate_up" if gated else "down", nt=nt, ksplit=ks, stages=st,
                                 tiles=2 if gated else tiles, err=err,
                                 plan=(nt == chosen[0] and (ks, st) == ek.SHAPES[nt]
                                       and (gated or tiles == chosen[1])),
                                 us=t.median_us if t else float("nan"),
                                 spread=f"{t.p20_us:.1f}-{t.p80_us:.1f}" if t else "",
                                 hbm=nbytes / (t.median_us * 1e-6) / c.hbm_bw if t else float("nan")))
        for name, fn, nbytes in (
                ("torch_gate_up", lambda: (torch._grouped_mm(xs, moe.w1.transpose(-2, -1), offs=offs),
                                           torch._grouped_mm(xs, moe.w3.transpose(-2, -1), offs=offs)),
                 distinct * 2 * h * d * 2),
                ("torch_down", lambda: torch._grouped_mm(hid, moe.w2.transpose(-2, -1), offs=offs),
                 distinct * h * d * 2)):
            t = time_graph(fn, reps=10, calls_per_graph=3)
            rows.append(dict(T=T, routing=routing, distinct=distinct, hottest=hottest, gemm=name, nt=0, ksplit=0,
                             stages=0, tiles=0, err=0.0, plan=False, us=t.median_us,
                             spread=f"{t.p20_us:.1f}-{t.p80_us:.1f}",
                             hbm=nbytes / (t.median_us * 1e-6) / c.hbm_bw))
        print(f"T={T} {routing}: {distinct} experts, hottest {hottest} slots", flush=True)
df = pd.DataFrame(rows)
pd.set_option("display.width", 250)
pd.set_option("display.max_rows", 500)
print(df.pivot_table(index=["gemm", "nt", "ksplit", "stages", "tiles"], columns=["T", "routing"], values="hbm")
      .round(3).to_string())
print(df[df.plan][["T", "routing", "gemm", "nt", "ksplit", "stages", "tiles", "us", "spread", "hbm"]]
      .round(3).to_string())
print("max err", df.err.max(), "failed", df[df.us.isna()][["T", "gemm", "nt", "ksplit", "stages", "tiles", "err"]]
      .to_string())
