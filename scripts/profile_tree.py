"""Where the tree build's time goes: host overhead (cProfile), effective SM clock, ncu target."""
import cProfile
import pstats
import sys

import cupy
import torch

import kdtree
from kdtree.bench.tree_bench import draft_inputs

lp, tok = draft_inputs(64, 15, 512, torch.device("cuda"))
kdtree.build_tree(lp, tok, 512)
torch.cuda.synchronize()
if "--ncu" in sys.argv:
    kdtree.build_tree(lp, tok, 512, validate=False)
    torch.cuda.synchronize()
    sys.exit(0)

# Effective SM clock: a kernel that spins a known number of cycles, timed with events.
spin = cupy.RawKernel(r'''extern "C" __global__ void spin(long long cycles, long long* out) {
    long long t0 = clock64(); while (clock64() - t0 < cycles) {} out[0] = clock64() - t0; }''', "spin")
out = torch.zeros(1, dtype=torch.int64, device="cuda")
for cyc in (10_000_000, 10_000_000):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    spin((1,), (1,), (cupy.int64(cyc), cupy.uint64(out.data_ptr())),
         stream=cupy.cuda.Stream.from_external(torch.cuda.current_stream()))
    e.record(); e.synchronize()
    print(f"effective SM clock while spinning: {cyc / (s.elapsed_time(e) * 1e3):.0f} MHz")

pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    kdtree.build_tree(lp, tok, 32, validate=False)
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
