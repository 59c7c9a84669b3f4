"""The DDTree draft tree: its dataclasses, torch references, and the public tree ops.

One DDTree round per sequence: the drafter gives per-position top-K log-probs; ``build_tree``
keeps the exact top-``budget`` prefixes by draft probability (best-first heap, the paper's
Prop. 3); the target verifies all tree nodes in one forward pass; ``accept_tree`` walks from the
root while the target agrees with a child; ``compact_kv`` moves the accepted KV rows behind the
prefix. The CUDA kernels in ``cuda/tree.cu`` are bit-identical to the references here.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import torch

MAX_DEPTH = 32     # L, draft positions after the root
MAX_TOPK = 1024    # K
MAX_BUDGET = 1024  # non-root nodes; N = budget + 1


@dataclass
class Tree:
    """A batch of draft trees, nodes in pop order (a parent precedes its children).

    Attributes
    ----------
    tokens : int32 [B, N]
        Node 0 is the root (its token, or -1 if not given); padding rows are -1.
    parents : int32 [B, N]
        Parent node index; -1 for the root and padding.
    depth : int32 [B, N]
        Root 0; padding -1.
    num_nodes : int32 [B]
        Real nodes per sequence, root included (fewer than N when fewer prefixes exist).
    visibility : int64 [B, N, ceil(N / 64)]
        Bit j (word j // 64, bit j % 64) of row i is set iff node j is an ancestor of i or i.
    draft_depth : int
        L, kept so shapes downstream are static.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    num_nodes: torch.Tensor
    visibility: torch.Tensor
    draft_depth: int

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def nodes(self) -> int:
        """N, the padded node count (budget + 1)."""
        return self.tokens.shape[1]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @classmethod
    def from_parents(cls, parents: torch.Tensor, tokens: torch.Tensor | None = None,
                     draft_depth: int | None = None) -> "Tree":
        """Build a Tree from a parent array [B, N] (-1 for root and padding), on its device.

        Node 0 must be the root and every parent must precede its child. Depth and the
        visibility mask are derived; useful for tests and for trees made elsewhere.
        """
        if parents.dim() != 2:
            raise ValueError(f"parents: expected [B, N], got shape {tuple(parents.shape)}")
        parents = parents.to(torch.int32)
        B, N = parents.shape
        idx = torch.arange(N, device=parents.device)
        valid = (parents >= 0) | (idx == 0)
        if bool((parents >= idx).any()):
            raise ValueError("parents: every parent must precede its child (parents[b, i] < i)")
        num_nodes = valid.sum(1).to(torch.int32)
        if bool((valid != (idx < num_nodes[:, None])).any()):
            raise ValueError("parents: real nodes must come first, padding (-1) after them")
        depth = torch.where(valid, 0, -1).to(torch.int32)
        p = parents.long().clamp(min=0)
        for i in range(1, N):  # parents precede children, so one pass settles depths
            depth[:, i] = torch.where(valid[:, i], depth.gather(1, p[:, i:i + 1])[:, 0] + 1, -1)
        L = int(depth.max()) if draft_depth is None else draft_depth
        if tokens is None:
            tokens = torch.where(valid, 0, -1).to(torch.int32)
        return cls(tokens.to(torch.int32), parents, depth, num_nodes,
                   visibility_reference(parents, num_nodes), L)


@dataclass
class Accepted:
    """The result of greedy tree acceptance.

    Attributes
    ----------
    indices : int32 [B, draft_depth + 1]
        Accepted node indices in walk order, root first, padded with -1.
    length : int32 [B]
        Accepted nodes, root included (1 = only the root: the bonus token alone).
    bonus : int32 [B]
        The target's token at the last accepted node.
    """

    indices: torch.Tensor
    length: torch.Tensor
    bonus: torch.Tensor


def visibility_reference(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self bitmask [B, N, ceil(N/64)] int64, by walking parent pointers (numpy)."""
    par = parents.cpu().numpy()
    B, N = par.shape
    W = (N + 63) // 64
    vis = np.zeros((B, N, W), dtype=np.uint64)
    for b in range(B):
        for i in range(int(num_nodes[b])):
            j = i
            while j >= 0:
                vis[b, i, j >> 6] |= np.uint64(1) << np.uint64(j & 63)
                j = par[b, j]
    return torch.from_numpy(vis.view(np.int64)).to(parents.device)
