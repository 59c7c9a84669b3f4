"""The MoE / step-model measurements of results/moe/ in one device call.

Usage: OUT=DIR PYTHONPATH=. python3 scripts/gpu_moe.py  (tables land in DIR/moe).
"""
import os, time
import torch
OUT = os.environ["OUT"] + "/moe"
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
def stamp(msg): print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)
from kdtree.bench import moe as M, stepmodel as S
from kdtree.bench.ceilings import measure_ceilings
from kdtree.bench.results import run_metadata, save_table
meta = run_metadata()
meta["fp8_support"] = M.fp8_support()
stamp(f"torch {torch.__version__}; fp8: {meta['fp8_support']}")
c = measure_ceilings(quick=True); c.save(f"{OUT}/ceilings.json"); stamp(c.caption())
meta["ceilings"] = c.caption()
moe = M.run_moe_bench("kimi_k2_ep8", (1, 17, 65, 257, 1025), fp8=True, ceilings=c, quick=True)
save_table(moe, f"{OUT}/moe_bench", meta); stamp("moe bench done")
print(moe[["variant", "routing", "tokens", "distinct", "kernels", "median_us", "gemm_us", "hbm_fraction", "gemm_hbm_fraction", "bound", "check_error", "error"]].round(3).to_string())
vals = []
for B, budgets in ((1, (16, 64, 256)), (4, (16, 64))):
    vals.append(S.validate("kimi_k2_ep8", layers=4, batch=B, budgets=budgets, prompt=512, new=64, steps=10))
    stamp(f"validation batch {B}"); print(vals[-1][["batch", "budget", "measured_us", "predicted_us", "ratio", "distinct_engine", "ratio_random", "distinct_random"]].round(3).to_string())
import pandas as pd
val = pd.concat(vals, ignore_index=True); save_table(val, f"{OUT}/validation", meta)
comps, speed = [], []
for name, layers, gpus in (("kimi_k2_ep8", 61, 8), ("qwen3_8b", 36, 1)):
    comp = S.measure_components(name, [1, 4, 16], list(S.PAPER_TAU), [4096, 32768], quick=True)
    comps.append(comp); stamp(f"components {name}")
    cfg = S.step_config(name)
    for comm in (("allreduce", "alltoall") if gpus > 1 else ("allreduce",)):
        speed.append(S.speedup_table(comp, layers=layers, first_dense=getattr(cfg, "first_dense", 0), batches=[1, 4, 16],
                                     prefixes=[4096, 32768], gpus=gpus, comm=comm, dim=cfg.dim,
                                     k=getattr(cfg, "n_active_experts", 8), label=name).assign(comm=comm))
speed = pd.concat(speed, ignore_index=True)
save_table(pd.concat(comps, ignore_index=True), f"{OUT}/components", meta)
save_table(speed, f"{OUT}/speedup", meta)
print(S.best_budgets(speed[speed.comm == "allreduce"]).round(3).to_string())
print(val[["batch", "budget", "measured_us", "predicted_us", "ratio", "ratio_random"]].round(3).to_string())
stamp("done")
