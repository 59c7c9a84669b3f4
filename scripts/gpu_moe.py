"""The MoE / step-model measurements of results/moe/ in one device call.

Usage: OUT=DIR PYTHONPATH=. python3 scripts/gpu_moe.py [steps]   (tables land in DIR/moe; a device
call returns at most 8 files, so pack the folder: tar czf DIR/moe.tgz -C DIR moe)

Steps (comma-separated, default all, in this order):
  check      pytest -m gpu tests/test_moe.py (the kernels against float64, compute-sanitizer memcheck)
  breakdown  kdtree.bench.moe.stage_breakdown on the kimi_k2_ep8 layer, kernel and torch paths,
             model routing, T in TOKENS -> breakdown.*
  bench      run_moe_bench("kimi_k2_ep8", TOKENS, fp8=True) -> moe_bench.*
  validate   stepmodel.validate_presets (every preset that fits one GPU, batch 1, PAPER_TAU
             budgets; env VAL_LAYERS (2), VAL_STEPS (3)) -> validation.*
  speedup    measure_components + speedup_table for kimi_k2_ep8 (61 layers, 8 GPUs) and
             qwen3_8b (36 layers, 1 GPU) -> components.*, speedup.*
"""
import os
import subprocess
import sys
import time

import pandas as pd
import torch

OUT = os.environ["OUT"] + "/moe"
os.makedirs(OUT, exist_ok=True)
STEPS = (sys.argv[1] if len(sys.argv) > 1 else "check,breakdown,bench,validate,speedup").split(",")
T0 = time.time()


def stamp(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


from kdtree.bench import moe as M, stepmodel as S  # noqa: E402
from kdtree.bench.ceilings import measure_ceilings  # noqa: E402
from kdtree.bench.results import run_metadata, save_table  # noqa: E402
from kdtree.engine.config import get_config  # noqa: E402

meta = run_metadata()
meta["fp8_support"] = M.fp8_support()
stamp(f"torch {torch.__version__}; fp8: {meta['fp8_support']}")
if "check" in STEPS:
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_moe.py"],
                         capture_output=True, text=True)
    open(f"{OUT}/gpu_tests.log", "w").write(res.stdout + res.stderr)
    stamp("gpu tests: " + (res.stdout.strip().splitlines() or ["?"])[-1])
c = measure_ceilings(quick=True)
c.save(f"{OUT}/ceilings.json")
meta["ceilings"] = c.caption()
stamp(c.caption())
TOKENS = (1, 17, 65, 257, 1025)
VAL_LAYERS, VAL_STEPS = int(os.environ.get("VAL_LAYERS", 2)), int(os.environ.get("VAL_STEPS", 3))
summary = []
if "breakdown" in STEPS:
    layer = M.moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    parts = []
    for T in TOKENS:
        x = torch.randn(T, layer.w1.shape[2], generator=gen).to("cuda", torch.bfloat16)
        expert = layer.route(x)[1]
        for backend in ("auto", "torch"):
            layer.backend = backend
            parts.append(M.stage_breakdown(layer, x, expert))
    layer = None
    bd = pd.concat(parts, ignore_index=True)
    bd["hbm_fraction"] = bd.weight_bytes / (bd.median_us * 1e-6) / c.hbm_bw
    save_table(bd, f"{OUT}/breakdown", meta)
    stamp("breakdown")
    print(bd.pivot_table(index=["path", "stage"], columns="tokens", values="median_us", sort=False).round(1)
          .to_string())
    print(bd[bd.weight_bytes > 0].pivot_table(index=["path", "stage"], columns="tokens", values="hbm_fraction",
                                               sort=False).round(3).to_string())
if "bench" in STEPS:
    moe = M.run_moe_bench("kimi_k2_ep8", TOKENS, fp8=True, ceilings=c, quick=True)
    save_table(moe, f"{OUT}/moe_bench", meta)
    stamp("moe bench")
    summary.append(moe.pivot_table(index=["variant", "routing"], columns="tokens", values="hbm_fraction",
                                   sort=False).round(3))
    summary.append(moe.pivot_table(index=["variant", "routing"], columns="tokens", values="median_us",
                                   sort=False).round(1))
    print(moe[["variant", "routing", "tokens", "distinct", "kernels", "median_us", "gemm_us", "hbm_fraction",
               "gemm_hbm_fraction", "check_error", "error"]].round(3).to_string())
if "validate" in STEPS:
    val = S.validate_presets(S.fitting_presets(), layers=VAL_LAYERS, batch=1, budgets=S.BUDGETS, steps=VAL_STEPS)
    save_table(val, f"{OUT}/validation", meta)
    stamp(f"validation ({VAL_LAYERS} layers, {VAL_STEPS} steps)")
    summary.append(val[["preset", "layers", "budget", "measured_us", "predicted_us", "ratio", "ratio_random",
                        "distinct_engine"]].round(3))
if "speedup" in STEPS:
    comps, speed = [], []
    for name, layers, gpus in (("kimi_k2_ep8", 61, 8), ("qwen3_8b", 36, 1)):
        comp = S.measure_components(name, [1, 4, 16], list(S.PAPER_TAU), [4096, 32768], quick=True)
        comps.append(comp)
        stamp(f"components {name}")
        cfg = S.step_config(name)
        for comm in (("allreduce", "alltoall") if gpus > 1 else ("allreduce",)):
            speed.append(S.speedup_table(comp, layers=layers, first_dense=getattr(cfg, "first_dense", 0),
                                         batches=[1, 4, 16], prefixes=[4096, 32768], gpus=gpus, comm=comm,
                                         dim=cfg.dim, k=getattr(cfg, "n_active_experts", 8), label=name)
                         .assign(comm=comm))
    speed = pd.concat(speed, ignore_index=True)
    save_table(pd.concat(comps, ignore_index=True), f"{OUT}/components", meta)
    save_table(speed, f"{OUT}/speedup", meta)
    summary.append(S.best_budgets(speed[speed.comm == "allreduce"]).round(3))
for table in summary:
    print(table.to_string())
stamp("done")
