"""Issue 5's engine measurements in one call: DDTree step breakdowns and throughput sweeps.

Usage (GPU host, from the repository root):

    python scripts/engine_bench.py --out DIR [--preset kimi_k2_attn] [--layers 8] [--batch 1]
        [--prompt 512] [--new 256] [--budgets 1,16,32,64,128,256,512] [--drafter small]
        [--accuracies paper,0.7,0.8,0.95]

Writes ``DIR/engine_throughput.csv`` (greedy, the single chain and DDTree per budget: tau,
tokens/s, speedup, lossless) and ``DIR/engine_breakdown.csv`` (per-phase step time), each in
eager mode and under CUDA-graph replay, plus ``DIR/engine_meta.json``. The drafter is the
synthetic one; ``paper`` is its calibration to the DDTree paper (``PAPER_MATH500_QWEN3_8B``),
a number is a top-1 accuracy at the same spread, and the breakdowns use the first entry. The
target has random weights, so only the systems side compares with the paper. Without CUDA it runs eagerly in
float32 (``--preset tiny`` as a smoke test).
"""
import argparse
import json
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import torch

from kdtree.engine import (PAPER_MATH500_QWEN3_8B, SyntheticDrafter, build_model, get_config,
                           get_drafter_config)
from kdtree.engine.profile import set_greedy_reference, step_breakdown, throughput_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", default="kimi_k2_attn")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    ap.add_argument("--drafter", default="small")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--budgets", default="1,16,32,64,128,256,512")
    ap.add_argument("--breakdown-budgets", default="16,64,256,512")
    ap.add_argument("--accuracies", default="paper,0.7,0.8,0.95")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per breakdown")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cfg = get_config(args.preset)
    cfg = replace(cfg, n_layers=args.layers) if args.layers else cfg
    model = build_model(cfg, seed=0, device=device, dtype=dtype)
    def drafter_for(label: str) -> SyntheticDrafter:
        knobs = PAPER_MATH500_QWEN3_8B | ({} if label == "paper" else {"accuracy": float(label)})
        return SyntheticDrafter(get_drafter_config(args.drafter), cfg.vocab_size, seed=0, device=device,
                                dtype=dtype, **knobs)

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (args.prompt,), generator=gen).to(device)
               for _ in range(args.batch)]
    budgets = [int(b) for b in args.budgets.split(",")]
    graph_modes = (False, True) if cuda else (False,)
    args.out.mkdir(parents=True, exist_ok=True)

    rows = []
    for label in args.accuracies.split(","):
        drafter = drafter_for(label)
        for graphed in graph_modes:
            rows += [r | {"accuracy": label} for r in
                     throughput_sweep(model, prompts, args.new, drafter, budgets, cuda_graph=graphed)]
            print(pd.DataFrame(rows).tail(len(budgets) + 2).to_string(index=False), flush=True)
    drafter = drafter_for(args.accuracies.split(",")[0])
    set_greedy_reference(model, prompts, args.new, drafter)
    through = pd.DataFrame(rows)
    through.to_csv(args.out / "engine_throughput.csv", index=False)

    rows = []
    for timing in ("eager", "graph") if cuda else ("eager",):
        rows += step_breakdown(model, prompts, mode="ar", steps=args.steps, timing=timing,
                               max_new_tokens=args.new)
        for budget in (int(b) for b in args.breakdown_budgets.split(",")):
            rows += step_breakdown(model, prompts, mode="ddtree", drafter=drafter, budget=budget,
                                   steps=args.steps, timing=timing, max_new_tokens=args.new)
    breakdown = pd.DataFrame(rows)
    breakdown.to_csv(args.out / "engine_breakdown.csv", index=False)
    print(breakdown.pivot_table(index="phase", columns=["timing", "mode", "budget"], values="median_us")
          .round(1).to_string(), flush=True)

    meta = dict(args={k: str(v) for k, v in vars(args).items()}, model=asdict(cfg),
                drafter=asdict(get_drafter_config(args.drafter)), calibration=PAPER_MATH500_QWEN3_8B,
                device=torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
                torch=torch.__version__, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                best_budget={f"{acc}/{'graph' if g else 'eager'}": int(part.sort_values("tokens_per_s")
                                                                         .iloc[-1]["budget"])
                             for (acc, g), part in through[through["mode"] == "ddtree"]
                             .groupby(["accuracy", "cuda_graph"])})
    (args.out / "engine_meta.json").write_text(json.dumps(meta, indent=2))
    print(json.dumps({k: meta[k] for k in ("device", "best_budget")}))


if __name__ == "__main__":
    main()
