"""A markdown table of one committed `scripts/gpu_new_kernel.sh` timing run (its timing.csv and
the header of its timing.log), for the perf log: us per kernel at each shape, the chosen kernel's
TFLOP/s and fractions of the ceilings measured in that same run, and its speedup over a base
kernel of the same run.

    python scripts/timing_table.py results/verify_attention_mask_h200/4f7c79a tma_seq wgmma
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def table(run: str, impl: str, base: str) -> str:
    d = pd.read_csv(Path(run) / "timing.csv")
    log = (Path(run) / "timing.log").read_text().splitlines()
    head = [line for line in log[:3] if line.strip()]
    impls = list(dict.fromkeys(d["impl"]))
    rows = [f"From `{run}` ({'; '.join(head)}).", "",
            "| B, N, H, P | " + " | ".join(f"{i} us" for i in impls)
            + f" | {impl} TFLOP/s | {impl} bf16 / HBM fraction | {impl} vs {base} |",
            "|" + "---|" * (len(impls) + 4)]
    for (B, N, H, P), g in d.groupby(["B", "N", "H", "P"], sort=False):
        g = g.set_index("impl")
        r = g.loc[impl]
        rows.append(f"| {B}, {N}, {H}, {P} | " + " | ".join(f"{g.loc[i, 'us']:.1f}" for i in impls)
                    + f" | {r['tflops']:.0f} | {r['frac_bf16']:.2f} / {r['frac_hbm']:.2f} "
                    + f"| {g.loc[base, 'us'] / r['us']:.2f}x |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(*sys.argv[1:4]))
