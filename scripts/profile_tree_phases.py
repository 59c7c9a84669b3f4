"""Per-phase cycle counts of the parallel tree build (cuda/tree.cu built with -DTREE_PROFILE).

Usage on a GPU host: PYTHONPATH=. python scripts/profile_tree_phases.py [budget,batch ...]
Prints, per shape, the median over sequences of: rounds, list length, and the cycles spent
staging + checking, in the threshold rounds, sorting, in the checks and writing the outputs.
"""
import sys

import numpy as np
import torch

from kdtree import kernels
from kdtree.bench.tree_bench import draft_inputs
from kdtree.tree import _CT, _NWARPS, _build_layout, _max_smem

shapes = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [(32, 1), (128, 64), (512, 64), (1024, 8)]
fn = kernels.get_kernel("tree", "build_tree", {"TOKEN_T": _CT[torch.int64], "TREE_PROFILE": 1})
print(f"{'budget':>6} {'batch':>5} {'path0':>5} {'rounds':>6} {'list':>5} {'stage':>7} {'rounds':>7} "
      f"{'sort':>7} {'checks':>7} {'output':>7}  (cycles, median over sequences)")
for budget, batch in shapes:
    lp, tok = draft_inputs(batch, 15, budget, torch.device("cuda"))
    B, L, K = lp.shape
    N = budget + 1
    smem, cap = _build_layout(L, K, budget, _max_smem(0))
    outs = [torch.empty((B, N), dtype=torch.int32, device="cuda") for _ in range(3)]
    num = torch.empty(B, dtype=torch.int32, device="cuda")
    vis = torch.empty((B, N, (N + 63) // 64), dtype=torch.int64, device="cuda")
    prof = torch.zeros((B, 8), dtype=torch.int32, device="cuda")
    args = (kernels.ptr(lp), kernels.ptr(tok), kernels.ptr(tok), np.int32(0), np.int32(L), np.int32(K),
            np.int32(budget), np.int32(cap), *(kernels.ptr(o) for o in outs), kernels.ptr(num),
            kernels.ptr(vis), kernels.ptr(prof))
    for _ in range(3):
        kernels.launch(fn, (B,), (32 * _NWARPS,), args, shared_mem=smem)
    torch.cuda.synchronize()
    p = prof.cpu().numpy()
    med = np.median(p, axis=0)
    t = med[3:8]
    print(f"{budget:>6} {batch:>5} {(p[:, 0] == 0).mean():>5.2f} {med[1]:>6.1f} {med[2]:>5.0f} {t[0]:>7.0f} "
          f"{t[1] - t[0]:>7.0f} {t[2] - t[1]:>7.0f} {t[3] - t[2]:>7.0f} {t[4] - t[3]:>7.0f}")
