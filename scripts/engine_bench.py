"""The engine's measurements in one call: DDTree step breakdowns and throughput sweeps.

Usage (GPU host, from the repository root):

    PYTHONPATH=. python scripts/engine_bench.py --out DIR [--preset kimi_k2_attn] [--layers 8] [--batch 1]
        [--prompt 512] [--new 256] [--budgets 1,16,32,64,128,256,512] [--drafter small]
        [--accuracies paper,0.7,0.8,0.95] [--max-rounds 16]

Writes ``DIR/engine_throughput.csv`` (greedy, the single chain and DDTree per budget: tau,
tokens/s, speedup, lossless, agree_ar, first_divergence, reference_rounds, self_consistent)
and ``DIR/engine_breakdown.csv`` (per-phase step time), each in eager mode and under
CUDA-graph replay, plus ``DIR/engine_meta.json``. The drafter is the synthetic one; ``paper``
is its calibration to the DDTree paper (``PAPER_MATH500_QWEN3_8B``), a number is a top-1
accuracy at the same spread, and the breakdowns use the first entry. The drafter's truth is
the target's greedy continuation along the path each run decodes: greedy decoding's output
where the run reproduces it (always in float32), the run's own output where a bf16 rounding
tie parts it from greedy decoding (``lossless`` False; ``kdtree.bench.engine_bench.self_consistent_run``).
The target has random weights, so only the systems side compares with the paper. Without
CUDA it runs eagerly in float32 (``--preset tiny`` as a smoke test).
"""
import argparse
import json
from pathlib import Path

from kdtree.bench.engine_bench import engine_tables


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
    ap.add_argument("--max-rounds", type=int, default=16, help="cap on the drafter reference's rounds per run (bf16)")
    args = ap.parse_args()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    through, breakdown, meta = engine_tables(
        args.preset, layers=args.layers, drafter=args.drafter, batch=args.batch, prompt=args.prompt,
        new=args.new, budgets=ints(args.budgets), breakdown_budgets=ints(args.breakdown_budgets),
        accuracies=args.accuracies.split(","), steps=args.steps, max_rounds=args.max_rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    through.to_csv(args.out / "engine_throughput.csv", index=False)
    breakdown.to_csv(args.out / "engine_breakdown.csv", index=False)
    (args.out / "engine_meta.json").write_text(json.dumps(meta | {"args": {k: str(v) for k, v in vars(args).items()}},
                                                          indent=2, default=str))
    print(through.to_string(index=False))
    print(breakdown.pivot_table(index="phase", columns=["mode", "decode", "budget"], values="median_us")
          .round(1).to_string())
    print(json.dumps({k: meta[k] for k in ("device", "best_budget")}))


if __name__ == "__main__":
    main()
