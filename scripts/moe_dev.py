"""The router kernels on one GPU beside the torch router, then the whole MoE layer with each.

Usage: PYTHONPATH=. python3 scripts/moe_dev.py [router|layer|stages|shapes|gushape|all]   (prints tables; one device call)

router: for the kimi_k2_ep8 MoE layer's router (dim 7168, 384 experts, top 8) at T in (1, 17,
65, 128): ``kdtree.experts.route`` with the "fma" kernel (default shape) and the "mma" kernel,
each first checked against the float64 reference (each token's k ids a top k of the float64
scores within 1e-5, the weights within 1e-5 of the float64 renormalisation of the chosen ones),
then timed by graph replay, warm L2 (five calls per graph: the 11 MB gate stays resident) and
cold L2 (one call per graph after a flush: the gate comes from HBM, as in the layer, where the
experts' weights evict it); the torch router (float32 GEMM, sigmoid, top-k, renormalisation)
timed the same way (warm). The HBM fraction is the gate's bytes over the time.

stages: ``kdtree.bench.moe.stage_breakdown`` of the kimi_k2_ep8 layer (bf16, kernel path) at
T = 1, 17, 65 under its own router and at T = 17 under Zipf (a = 1.2), and ``run_moe_bench``'s
whole-layer rows at those points (time, HBM fraction against this run's ceiling).

shapes: the kimi_k2_ep8 layer's gate/up and down grouped GEMMs alone (graph replay, L2 warm) at
T = 1, 17, 65 under its own router, for (warps splitting K, ring depth) in ``SHAPE_TRIALS``.

gushape: the whole layer (``run_moe_bench``, T = 1, 2, 4, 8, 17, model and Zipf routing) with the gate/up
GEMM's small-T shape (``kdtree.experts.GATE_UP_SMALL_SHAPE``) used up to each of ``GU_TRIALS``
tokens (``GATE_UP_SMALL_T``; 0: never), alternating, in one process. (Its committed log,
``results/moe/t1_h200/gushape.log``, ran the same comparison when the shape applied to every
T of one token tile: its columns ``{1: (8, 3)}`` and ``{}``.)

layer: ``kdtree.bench.moe.run_moe_bench`` (bf16, model and Zipf a = 1.2 routing, T = 17 and
65, graph replay, this run's measured HBM bandwidth) once with each router kernel as
``kdtree.experts.ROUTER_KERNEL``: the layer's time and its fraction of HBM bandwidth.
"""
import functools
import sys

import pandas as pd
import torch

from kdtree import experts as ek
from kdtree.bench.ceilings import measure_ceilings
from kdtree.bench.moe import moe_layer, routing_ids, run_moe_bench, stage_breakdown
from kdtree.bench.timing import time_graph
from kdtree.engine.config import get_config

STEPS = sys.argv[1] if len(sys.argv) > 1 else "all"
KERNELS = ("fma", "mma")
pd.set_option("display.width", 200)
c = measure_ceilings(quick=True)
print(c.caption(), flush=True)


def router_rows(moe) -> list[dict]:
    gate, k, scale = moe.gate.weight, moe.k, float(moe.scale)
    rows = []
    for T in (1, 17, 65, 128):
        x = torch.randn(T, gate.shape[1], device="cuda").to(torch.bfloat16)
        s64 = torch.sigmoid(x.double() @ gate.double().T)
        for kernel in KERNELS:
            w, e = ek.route(x, gate, k, scale, kernel=kernel)
            chosen = s64.gather(1, e)
            ok = bool((chosen.amin(1) >= s64.scatter(1, e, -1.0).amax(1) - 1e-5).all()) and bool(
                torch.allclose(w.double(), chosen / chosen.sum(1, keepdim=True) * scale, atol=1e-5 * scale))
            for l2, calls in (("warm", 5), ("cold", 1)):
                t = time_graph(lambda x=x, kernel=kernel: ek.route(x, gate, k, scale, kernel=kernel), reps=30,
                               calls_per_graph=calls, l2=l2) if ok else None
                rows.append(dict(T=T, router=kernel, ok=ok, **(t.as_dict() if t else {"l2": l2})))
        moe.backend = "torch"
        t = time_graph(lambda x=x: moe.route(x), reps=30, calls_per_graph=5)
        rows.append(dict(T=T, router="torch", ok=True, **t.as_dict()))
        moe.backend = "auto"
    return rows


if STEPS in ("router", "all"):
    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
    df = pd.DataFrame(router_rows(moe))
    df["gate_hbm_fraction"] = moe.gate.weight.numel() * 4 / (df.median_us * 1e-6) / c.hbm_bw
    del moe
    torch.cuda.empty_cache()
    print(df[["T", "router", "l2", "ok", "median_us", "p20_us", "p80_us", "sm_clock_mhz",
              "gate_hbm_fraction"]].round(3).to_string(index=False), flush=True)
    print("failed checks:", "none" if df.ok.all() else df[~df.ok][["T", "router"]].to_string(), flush=True)

if STEPS in ("layer", "all"):
    default, frames = ek.ROUTER_KERNEL, []
    for kernel in KERNELS:
        ek.ROUTER_KERNEL = kernel
        d = run_moe_bench("kimi_k2_ep8", tokens=(17, 65), routings=("model", "zipf"), zipf_a=1.2, fp8=False,
                          ceilings=c)
        frames.append(d[d.variant == "bf16"].assign(router=kernel))
        torch.cuda.empty_cache()
    ek.ROUTER_KERNEL = default
    lay = pd.concat(frames)
    print(lay[["router", "routing", "tokens", "distinct", "median_us", "p20_us", "p80_us", "gemm_us",
               "hbm_fraction", "error"]].round(3).to_string(index=False), flush=True)
    print(lay.pivot_table(index=["routing", "tokens"], columns="router", values="hbm_fraction").round(3).to_string())

if STEPS in ("stages", "all"):
    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    frames = []
    for routing, T in (("model", 1), ("model", 17), ("model", 65), ("zipf", 17)):
        x = torch.randn(T, moe.w1.shape[2], generator=gen).to("cuda", torch.bfloat16)
        expert = moe.route(x)[1] if routing == "model" else \
            routing_ids("zipf", T, moe.n_routed, moe.k, zipf_a=1.2, generator=gen).cuda()
        frames.append(stage_breakdown(moe, x, expert).assign(routing=routing))
    st = pd.concat(frames)
    st["hbm_fraction"] = st.weight_bytes / (st.median_us * 1e-6) / c.hbm_bw
    print(st.pivot_table(index="stage", columns=["routing", "tokens"], values="median_us", sort=False).round(1)
          .to_string(), flush=True)
    print(st[st.stage == "whole"][["routing", "tokens", "distinct", "median_us", "p20_us", "p80_us",
                                   "hbm_fraction"]].round(3).to_string(index=False), flush=True)
    del moe
    torch.cuda.empty_cache()
    d = run_moe_bench("kimi_k2_ep8", tokens=(1, 17, 65), routings=("model", "zipf"), zipf_a=1.2, fp8=False,
                      ceilings=c)
    print(d[d.variant == "bf16"][["routing", "tokens", "distinct", "kernels", "median_us", "p20_us", "p80_us",
                                  "hbm_fraction", "error"]].round(3).to_string(index=False), flush=True)

SHAPE_TRIALS = ((4, 4), (4, 5), (2, 8), (2, 10), (8, 3), (8, 2))
if STEPS in ("shapes", "all"):
    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    sh = (moe.shared.w1.weight, moe.shared.w3.weight, moe.shared.w2.weight)
    rows_out = []
    for T in (1, 17, 65):
        x = torch.randn(T, moe.w1.shape[2], generator=gen).to("cuda", torch.bfloat16)
        expert = moe.route(x)[1]
        E, k = moe.w1.shape[0], moe.k
        offs, rowidx, pos, active = ek.permute(expert, E)
        nt, rows, groups = ek.chunk_tiles(T, k, moe.n_routed), T * k + T, min(E, T * k)
        common = dict(nt=nt, shared_first=T * k, active=active, groups=groups)
        gu = dict(x=x, w=moe.w1, offs=offs, rows=rows, up=moe.w3, rowidx=rowidx, shared=sh[0], shared_up=sh[1], **common)
        hid = ek.grouped_gemm(**gu)
        dn = dict(x=hid, w=moe.w2, offs=offs, rows=rows, shared=sh[2], **common)
        for shape in SHAPE_TRIALS:
            if ek.smem_bytes(nt, *shape) > 227 * 1024:
                continue
            for name, kw in (("gate_up", gu), ("down", dn)):
                fn = functools.partial(ek.grouped_gemm, shape=shape, **kw)
                try:
                    fn()
                except ValueError:   # the shape does not divide this GEMM's K (the shared down's 256)
                    continue
                t = time_graph(fn, reps=20, calls_per_graph=3)
                rows_out.append(dict(T=T, nt=nt, stage=name, shape=f"{shape[0]}x{shape[1]}", us=t.median_us))
    sp = pd.DataFrame(rows_out)
    print(sp.pivot_table(index=["stage", "T"], columns="shape", values="us", sort=False).round(1).to_string(),
          flush=True)

GU_TRIALS = (8, 1, 0)
if STEPS in ("gushape", "all"):
    default, frames = ek.GATE_UP_SMALL_T, []
    for rep in range(2):
        for trial in GU_TRIALS:
            ek.GATE_UP_SMALL_T = trial
            d = run_moe_bench("kimi_k2_ep8", tokens=(1, 2, 4, 8, 17), routings=("model", "zipf"), zipf_a=1.2,
                              fp8=False, ceilings=c)
            frames.append(d[d.variant == "bf16"].assign(trial=f"small shape up to T = {trial}", rep=rep))
            torch.cuda.empty_cache()
    ek.GATE_UP_SMALL_T = default
    g = pd.concat(frames)
    print(g.pivot_table(index=["routing", "tokens"], columns=["trial", "rep"], values="median_us").round(1).to_string())
    print(g.pivot_table(index=["routing", "tokens"], columns=["trial", "rep"], values="hbm_fraction").round(3)
          .to_string(), flush=True)
