"""The kimi_k2_ep8 MoE layer at T tokens, called twice, for Nsight Compute (the second call's kernels).

Usage: ncu --clock-control none --cache-control all -k regex:moe_ --launch-skip 5 --launch-count 5
       --metrics ... --csv python3 scripts/ncu_moe_layer.py [T]
The layer is five launches (router, permute, gate/up, down, combine), every kernel named moe_*;
the first call compiles and warms them. The filter matters: without it the skip counts torch's
kernels that initialise the weights.
"""
import sys

import torch

from kdtree.bench.moe import moe_layer
from kdtree.engine.config import get_config

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1
moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
x = torch.randn(T, moe.w1.shape[2], generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
for _ in range(2):
    moe(x)
torch.cuda.synchronize()
