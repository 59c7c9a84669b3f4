"""The kimi_k2_ep8 bf16 MoE layer (its own router) timed from several source trees, alternating.

    python scripts/moe_ab.py TREE TREE ... [-- T ...]      (GPU host; default T = 1 2 4 8 17 65)

Each tree (a folder holding ``kdtree/`` and ``cuda/``) runs in its own process, twice, all trees in
turn, then again (``ab_trees.alternate``): the layer built
from the same seed, at each T the input of ``trace_moe.typical_input`` (its routing touches the
typical number of local experts), the output checked against the float64 reference, then
timed by CUDA-graph replay (median and p20-p80 of 20 replays of 3 calls). Prints one table.
"""
from __future__ import annotations

import json
import sys

from ab_trees import table


def child(Ts: list[int]) -> None:
    import torch

    from kdtree.bench.moe import _check, moe_layer
    from kdtree.bench.timing import time_graph
    from kdtree.engine.config import get_config
    from trace_moe import typical_input

    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
    out = {}
    for T in Ts:
        x, touched = typical_input(moe, T)
        w, e = moe.route(x)
        _check(moe, x[:5], w[:5], e[:5])
        t = time_graph(lambda x=x: moe(x), reps=20, calls_per_graph=3)
        out[T] = (touched, t.median_us, t.p20_us, t.p80_us)
    print("RESULT " + json.dumps(out))


def main() -> None:
    if sys.argv[1] == "--child":
        child([int(t) for t in sys.argv[2:]])
        return
    table(__file__, sys.argv[1:], ["1", "2", "4", "8", "17", "65"], "T", 22,
          lambda c: f"{c[1]:8.1f} [{c[2]:.1f}, {c[3]:.1f}]", lead=("experts", lambda c: c[0]))


if __name__ == "__main__":
    main()
