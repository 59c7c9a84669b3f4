"""Small run of every kernel of cuda/moe_grouped.cu, cuda/moe_router.cu and cuda/moe_router_mma.cu,
for compute-sanitizer (see test_moe.py)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kdtree import experts as ek  # noqa: E402
from moe_cases import COUNTS, grouped_case, grouped_error  # noqa: E402

for i, (name, counts) in enumerate(COUNTS.items()):
    for gated, N in ((True, 48), (False, 64)):
        for nt in (1, 4):
            for shared in (None, (N // 16 * 16 if gated else N, 512 if gated else 256, 11)):
                got, ref, _ = grouped_case(counts, 512, N, gated, nt, seed=i, gather=gated, shared=shared)
                err, bound = grouped_error(got, ref, gated)
                assert err <= bound, (name, gated, nt, shared, err)
    for gated, N in ((True, 48), (False, 64)):   # routed rows walking the active list
        grid = dict(groups=len(counts), rows_routed=2)
        got, ref, _ = grouped_case(counts, 512, N, gated, 1, seed=i, gather=True, shared=(N, 256, 11), grid=grid)
        err, bound = grouped_error(got, ref, gated)
        assert err <= bound, (name, gated, "rows_routed 2", err)
g = torch.Generator(device="cuda").manual_seed(0)
T, k, E = 13, 4, 6
expert = torch.stack([torch.randperm(16, device="cuda", generator=g)[:k] for _ in range(T)])
x = torch.randn(T, 256, device="cuda", generator=g).to(torch.bfloat16)
w1, w3 = (torch.randn(2, E, 256, 256, device="cuda", generator=g) / 16).to(torch.bfloat16)
w2 = (torch.randn(E, 256, 256, device="cuda", generator=g) / 16).to(torch.bfloat16)
weight = torch.rand(T, k, device="cuda", generator=g)
shared = ((torch.randn(3, 256, 256, device="cuda", generator=g) / 16).to(torch.bfloat16)).unbind(0)
ek.routed_experts(x, weight, expert, w1, w3, w2, shared=shared, experts_total=16)
for T in (1, 40, 130):      # both fma router shapes, partial token tiles; the mma router's partial
    xr = torch.randn(T, 1024, device="cuda", generator=g).to(torch.bfloat16)   # n-tiles, two passes,
    gr = torch.randn(64, 1024, device="cuda", generator=g) / 32                # finalisers looping (T > 128)
    ek.route(xr, gr, 6, 1.0, kernel="fma")
    ek.route(xr, gr, 6, 1.0, kernel="mma")
    ek.route_permuted(xr[:3], gr, 6, 1.0, 16)   # the router's finaliser permuting (T <= 4)
torch.cuda.synchronize()
print("selfcheck ok")
