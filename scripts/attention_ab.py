"""The fused verify-attention kernel timed from several source trees, alternating (GPU host).

    python scripts/attention_ab.py TREE TREE ... [-- B,N,H,P ...]
    (default shapes: 1,33,64,4096 16,33,64,16384 1,257,64,4096 64,9,8,16384; IMPL=pair by default)

Each tree (a folder holding ``kdtree/`` and ``cuda/``) runs in its own process, twice, all trees in
turn, then again (``ab_trees.alternate``): at each shape the input sets of ``attention_dev`` (the
same seed in every process, enough sets to rotate over 2.5x the L2: cold L2), the kernel ``IMPL``
checked against float64 (first and last sequence), then timed by CUDA-graph replay (median and
p20-p80). ``VARIANT`` (``fused`` by default, or ``cascade``) picks what each tree runs, so that
``. .@VARIANT=cascade`` times the two variants of one tree against each other. Prints one table.
``ONE_CALL=1`` times one call a replay, the L2 flushed before each: the
kernel's code is then cold as well (as after an MoE layer streamed its weights), where the rotating
graph fetches it once per replay of many calls.
"""
from __future__ import annotations

import functools
import json
import os
import sys

from ab_trees import table

SHAPES = ["1,33,64,4096", "16,33,64,16384", "1,257,64,4096", "64,9,8,16384"]


def child(shapes: list[str]) -> None:
    import torch

    from attention_dev import check_config, input_sets, references, run_config, time_config

    from kdtree.bench.timing import time_graph

    impl = os.environ.get("IMPL", "pair")
    variant = os.environ.get("VARIANT", "fused")
    if variant not in ("fused", "cascade"):
        sys.exit(f"VARIANT: expected fused or cascade, got {variant!r}")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator().manual_seed(6)
    out = {}
    for shape in shapes:
        B, N, H, P = (int(v) for v in shape.split(","))
        tree, pl, sets = input_sets(B, N, H, P, gen, l2)
        o = (torch.empty(B, N, H, 512, dtype=torch.bfloat16, device="cuda"),
             torch.empty(B, N, H, dtype=torch.float32, device="cuda"))
        run_config(variant, tree, pl, *sets[0], o, impl=impl)
        _, wrong = check_config(references(tree, pl, *sets[0]), o)
        if wrong:
            sys.exit(f"{shape}: {wrong}")
        if os.environ.get("ONE_CALL") == "1":  # the L2 flushed before each single call: code cold too
            t = time_graph(functools.partial(run_config, variant, tree, pl, *sets[0], o, impl=impl), reps=20,
                           calls_per_graph=1, warmup=2, l2="cold")
        else:
            t = time_config(variant, tree, pl, sets, o, impl=impl)
        out[shape] = (t.median_us, t.p20_us, t.p80_us)
        sets.clear()
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps(out))


def main() -> None:
    if sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    table(__file__, sys.argv[1:], SHAPES, "B,N,H,P", 24, lambda c: f"{c[0]:8.1f} [{c[1]:.1f}, {c[2]:.1f}]")


if __name__ == "__main__":
    main()
