"""What bf16 split partials cost in accuracy, emulated on the CPU (no GPU needed).

    python scripts/partials_precision.py [OUT.csv]

For a few split shapes of the verify grid, random N(0, 1) bf16 queries and latent rows (the GPU
tests' inputs) are attended in float64; each split's O is normalised by its own row sum, rounded
to fp32 or to bf16 (the two partial formats), its lse kept in fp32, and the splits merged with
softmax weights of their lse in fp32 and rounded to the bf16 output, as ``verify_combine`` does.
Prints, per shape, the largest relative Frobenius error over three draws (``errors``' measure,
held to 1e-2 by the tests) for each format, and that of the float64 result rounded to bf16 alone.
"""
from __future__ import annotations

import csv
import math
import sys

import torch

SCALE = 1 / math.sqrt(192)
# (query rows, prefix tokens, splits): B = 1, N = 33, H = 64 at P = 4096 in 4 splits; 8 heads of
# 64 sequences' worth of rows at P = 16384 in 11; a 288-row launch at P = 16384 in 26.
SHAPES = [(2112, 4096, 4), (512, 16384, 11), (288, 16384, 26)]


def merged_error(rows: int, prefix: int, splits: int, fmt: torch.dtype | None, gen: torch.Generator) -> float:
    """One draw's relative error of the merged bf16 output (``fmt`` None: no split, rounding only)."""
    q = torch.randn(rows, 576, generator=gen).bfloat16().double()
    kv = torch.randn(prefix, 576, generator=gen).bfloat16().double()
    s = (q @ kv.T) * SCALE
    ref = torch.softmax(s, 1) @ kv[:, :512]
    if fmt is None:
        out = ref
    else:
        parts, lse = [], []
        for cols in torch.tensor_split(torch.arange(prefix), splits):
            m = s[:, cols].max(1, keepdim=True).values
            p = torch.exp(s[:, cols] - m)
            l = p.sum(1, keepdim=True)
            parts.append(((p @ kv[cols, :512]) / l).float().to(fmt).float())
            lse.append((m + torch.log(l)).float())
        w = torch.softmax(torch.cat(lse, 1), 1)
        out = sum(w[:, i:i + 1] * parts[i] for i in range(splits))
    out = out.float().bfloat16().double()
    return float((out - ref).norm() / ref.norm())


def main() -> None:
    rows = []
    for R, P, S in SHAPES:
        row = {"rows": R, "prefix": P, "splits": S}
        for name, fmt in (("bf16 output alone", None), ("fp32 partials", torch.float32),
                          ("bf16 partials", torch.bfloat16)):
            gen = torch.Generator().manual_seed(0)        # the same draws for every format
            row[name] = max(merged_error(R, P, S, fmt, gen) for _ in range(3))
        rows.append(row)
        print(", ".join(f"{k} {v:.3e}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
