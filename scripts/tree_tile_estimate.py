"""How many KV tiles an H = 64 verify block would walk if it also skipped the tree tiles that hold
none of its node's ancestors, against the range it walks now (ending after its node) and the
whole tree, on the random trees the benchmark draws (CPU; no kernel runs).

    python scripts/tree_tile_estimate.py [SEED]

At H = 64 a block holds one node's 64 heads, so its visible tree rows are that node's ancestors
and itself. A tile holding prefix rows is walked either way.
"""
from __future__ import annotations

import math
import sys

import torch

from kdtree.attention import random_parents
from kdtree.tree import Tree, visibility_mask

TILE = 64


def tiles(N: int, P: int, gen: torch.Generator) -> tuple[int, int, int]:
    """(whole tree, range to the node, range without ancestor-free tree tiles), summed over nodes."""
    tree = Tree.from_parents(random_parents(1, N, torch.tensor([N]), gen))
    bits = visibility_mask(tree.visibility, torch.zeros(1, dtype=torch.long), N)[0]     # [N, N]
    whole = N * math.ceil((P + N) / TILE)
    to_node = skip = 0
    for n in range(N):
        walked = math.ceil((P + n + 1) / TILE)
        seen = {(P + j) // TILE for j in torch.nonzero(bits[n]).flatten().tolist()}
        to_node += walked
        skip += sum(1 for t in range(walked) if t * TILE < P or t in seen)
    return whole, to_node, skip


def main() -> None:
    gen = torch.Generator().manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print("| N | P | to the node / whole tree | skipping too / whole tree | skipping / to the node |")
    print("|---|---|---|---|---|")
    for N in (129, 257, 513):
        for P in (1024, 4096):
            whole, to_node, skip = tiles(N, P, gen)
            print(f"| {N} | {P} | {to_node / whole:.3f} | {skip / whole:.3f} | {skip / to_node:.3f} |")


if __name__ == "__main__":
    main()
