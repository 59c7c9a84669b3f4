"""The DDTree draft tree: its dataclasses, torch references, and the public tree ops.

One DDTree round per sequence: the drafter gives per-position top-K log-probs; ``build_tree``
keeps the exact top-``budget`` prefixes by draft probability (best-first heap, the paper's
Prop. 3); the target verifies all tree nodes in one forward pass; ``accept_tree`` walks from the
root while the target agrees with a child; ``compact_kv`` moves the accepted KV rows behind the
prefix. The CUDA kernels in ``cuda/tree.cu`` are bit-identical to the references here.
"""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import numpy as np
import torch

from kdtree.checks import check_storage, check_tensor, check_token_ids, reads_values

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

        Node 0 must be the root and every parent must precede its child; ``tokens`` (ids in
        -1..2**31 - 1, -1 for padding) default to 0 for real nodes. Depth and the visibility
        mask are derived; useful for tests and for trees made elsewhere.
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
        check_token_ids("tokens", tokens, low=-1)
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


def visibility_mask(visibility: torch.Tensor, prefix_lens: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Which cache rows each tree node may attend to, as a boolean [B, N, kv_len] mask.

    Parameters
    ----------
    visibility : int64 [B, N, ceil(N / 64)]
        ``Tree.visibility``: bit j of row i is set iff node j is an ancestor of node i or i. Bits
        of nodes after i are ignored (a parent precedes its child, so none is an ancestor), as the
        CUDA kernels ignore them.
    prefix_lens : int [B]
        The tree rows of sequence b sit at cache rows ``prefix_lens[b] + j``.
    kv_len : int
        Cache rows to cover.

    Returns
    -------
    bool tensor [B, N, kv_len]
        True for every prefix row and for the tree rows of visible nodes; False elsewhere (rows
        past the tree, invisible nodes). No host synchronisation, so it can be graph-captured.
    """
    B, N, _ = visibility.shape
    dev = visibility.device
    bits = (visibility[..., None] >> torch.arange(64, device=dev)) & 1          # [B, N, W, 64]
    bits = bits.reshape(B, N, -1)[:, :, :N].bool()                              # [B, N, N]
    bits &= torch.ones(N, N, dtype=torch.bool, device=dev).tril()              # ancestors precede a node
    j = torch.arange(kv_len, device=dev)[None, :] - prefix_lens.long()[:, None]  # tree index [B, S]
    in_tree = (j >= 0) & (j < N)
    seen = torch.gather(bits, 2, j.clamp(0, N - 1)[:, None, :].expand(B, N, kv_len))
    return (j < 0)[:, None, :] | (in_tree[:, None, :] & seen)


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


# ---------------------------------------------------------------------------------------------
# Validation: every check that needs no device synchronisation runs always; the data checks
# (NaN/inf, sorted rows, token ids, accepted rows) read the values and sit behind ``validate=``;
# they are skipped inside a CUDA-graph capture, which cannot read values.
# ---------------------------------------------------------------------------------------------

_INT = (torch.int32, torch.int64)


def _check_build_args(logprobs, tokens, budget, root_tokens, validate: bool) -> None:
    check_tensor("logprobs", logprobs, (torch.float32,), 3)
    check_tensor("tokens", tokens, _INT, 3)
    if tokens.shape != logprobs.shape:
        raise ValueError(f"tokens: shape {tuple(tokens.shape)} must equal logprobs' {tuple(logprobs.shape)}")
    if tokens.device != logprobs.device:
        raise ValueError(f"tokens: on {tokens.device}, logprobs on {logprobs.device}")
    B, L, K = logprobs.shape
    if not (isinstance(budget, int) and not isinstance(budget, bool)):
        raise TypeError(f"budget: expected an int, got {type(budget).__name__}")
    if not (1 <= budget <= MAX_BUDGET):
        raise ValueError(f"budget: must be in 1..{MAX_BUDGET}, got {budget}")
    if B < 1:
        raise ValueError("logprobs: batch dimension is empty")
    if not (1 <= L <= MAX_DEPTH):
        raise ValueError(f"logprobs: draft depth L must be in 1..{MAX_DEPTH}, got {L}")
    if not (1 <= K <= MAX_TOPK):
        raise ValueError(f"logprobs: top-K must be in 1..{MAX_TOPK}, got {K}")
    if root_tokens is not None:
        check_tensor("root_tokens", root_tokens, _INT, 1)
        if root_tokens.shape[0] != B:
            raise ValueError(f"root_tokens: expected shape ({B},), got {tuple(root_tokens.shape)}")
        if root_tokens.device != logprobs.device:
            raise ValueError(f"root_tokens: on {root_tokens.device}, logprobs on {logprobs.device}")
    if reads_values(validate, logprobs.device):
        if not bool(torch.isfinite(logprobs).all()):
            raise ValueError("logprobs: contains NaN or infinite values (topk_logprobs clamps -inf to the float32 minimum)")
        if not bool((logprobs[..., 1:] <= logprobs[..., :-1]).all()):
            raise ValueError("logprobs: every [b, l, :] row must be sorted in descending order")
        check_token_ids("tokens", tokens)
        if root_tokens is not None:
            check_token_ids("root_tokens", root_tokens, low=-1)


def _backend(backend: str, device: torch.device) -> str:
    if backend not in ("auto", "torch", "cuda"):
        raise ValueError(f"backend: expected 'auto', 'torch' or 'cuda', got {backend!r}")
    if backend == "auto":
        return "cuda" if device.type == "cuda" else "torch"
    if backend != "torch" and device.type != "cuda":
        raise ValueError(f"backend: 'cuda' needs CUDA tensors, got tensors on {device}")
    return backend


# ---------------------------------------------------------------------------------------------
# References: the paper's algorithm, one Python heap per request.
# ---------------------------------------------------------------------------------------------

def heap_build(lp: np.ndarray, budget: int) -> tuple[list[int], list[int], list[int]]:
    """Best-first DDTree build of one request, exactly as the paper's reference does it.

    Parameters
    ----------
    lp : float32 ndarray [L, K], rows sorted descending.
    budget : number of non-root nodes to pop.

    Returns
    -------
    parents, ranks, depths : lists over nodes in pop order, node 0 the root (-1, -1, 0).

    Heap entries are ``(-score, rank_tuple, parent, rank)``: scores are float64 sums of the
    float32 log-probs, a sibling's score is ``(w - lp[d][r]) + lp[d][r + 1]``, and exact ties
    fall to the rank tuple, where a prefix sorts before its extensions.
    """
    L, K = lp.shape
    rows = lp.astype(np.float64).tolist()
    heap = [(-(0.0 + rows[0][0]), (0,), 0, 0)]
    parents, ranks, depths = [-1], [-1], [0]
    while heap and len(parents) <= budget:
        neg, path, par, r = heapq.heappop(heap)
        w, d, n = -neg, len(path), len(parents)
        parents.append(par), ranks.append(r), depths.append(d)
        row = rows[d - 1]
        if r + 1 < K:
            heapq.heappush(heap, (-((w - row[r]) + row[r + 1]), path[:-1] + (r + 1,), par, r + 1))
        if d < L:
            heapq.heappush(heap, (-(w + rows[d][0]), path + (0,), n, 0))
    return parents, ranks, depths


def _pack_visibility(parents: list[int], N: int) -> np.ndarray:
    """Ancestor-or-self bitmask of one tree as [N, ceil(N/64)] int64, with numpy."""
    dense = np.zeros((N, ((N + 63) // 64) * 64), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            dense[i] = dense[p]
        dense[i, i] = True
    return np.packbits(dense, axis=1, bitorder="little").view(np.int64)


def _host_tree(lp: np.ndarray, tok: np.ndarray, budget: int, root: int) -> tuple[np.ndarray, ...]:
    """One request on the host: heap build, token gather, numpy visibility; padded to N rows."""
    N = budget + 1
    parents, ranks, depths = heap_build(lp, budget)
    n = len(parents)
    out_tok = np.full(N, -1, np.int32)
    out_par = np.full(N, -1, np.int32)
    out_dep = np.full(N, -1, np.int32)
    out_par[:n], out_dep[:n] = parents, depths
    d, r = np.asarray(depths[1:], np.int64), np.asarray(ranks[1:], np.int64)
    out_tok[0] = root
    out_tok[1:n] = tok[d - 1, r]
    return out_tok, out_par, out_dep, np.int32(n), _pack_visibility(parents, N)


def build_tree_reference(logprobs, tokens, budget, root_tokens=None, *, path: str = "serving") -> Tree:
    """Build the trees on the CPU, the way today's serving stacks and the paper do it.

    ``path="serving"``: one batched device-to-host copy of the top-K, a per-request Python
    loop, one batched host-to-device copy of the trees. ``path="paper"``: the paper's reference,
    request by request (copy in, Python heap, numpy visibility, copy out per request). Both
    give the same Tree, on the inputs' device.
    """
    B, L, K = logprobs.shape
    dev = logprobs.device
    if path == "serving":
        lp, tok = logprobs.cpu().numpy(), tokens.cpu().numpy()
        roots = root_tokens.cpu().numpy() if root_tokens is not None else np.full(B, -1)
        parts = [_host_tree(lp[b], tok[b], budget, int(roots[b])) for b in range(B)]
        cols = [torch.from_numpy(np.stack([p[i] for p in parts])) for i in range(5)]
        t, p, d, n, v = (c.to(dev, non_blocking=False) for c in cols)
    elif path == "paper":
        rows = []
        for b in range(B):
            root = int(root_tokens[b]) if root_tokens is not None else -1
            part = _host_tree(logprobs[b].cpu().numpy(), tokens[b].cpu().numpy(), budget, root)
            rows.append([torch.from_numpy(np.asarray(x)).to(dev) for x in part])
        t, p, d, n, v = (torch.stack([r[i] for r in rows]) for i in range(5))
    else:
        raise ValueError(f"path: expected 'serving' or 'paper', got {path!r}")
    return Tree(t, p, d, n, v, L)


def accept_reference(tree: Tree, target_tokens: torch.Tensor) -> Accepted:
    """Greedy walk on the host: move to the lowest-index child whose token the target chose."""
    tok, par = tree.tokens.cpu().numpy(), tree.parents.cpu().numpy()
    tgt, num = target_tokens.cpu().numpy(), tree.num_nodes.cpu().numpy()
    B, M = tok.shape[0], tree.draft_depth + 1
    idx = np.full((B, M), -1, np.int32)
    length, bonus = np.zeros(B, np.int32), np.zeros(B, np.int32)
    for b in range(B):
        cur, path = 0, [0]
        while len(path) < M:
            kids = [j for j in range(1, int(num[b])) if par[b, j] == cur and tok[b, j] == tgt[b, cur]]
            if not kids:
                break
            cur = kids[0]
            path.append(cur)
        idx[b, :len(path)], length[b], bonus[b] = path, len(path), tgt[b, cur]
    dev = tree.device
    return Accepted(torch.from_numpy(idx).to(dev), torch.from_numpy(length).to(dev),
                    torch.from_numpy(bonus).to(dev))


def compact_kv_reference(kv: torch.Tensor, prefix_lens: torch.Tensor, accepted: Accepted) -> None:
    """In-place compaction with torch indexing (gather first, then scatter).

    Like the CUDA kernel, it skips whole any sequence whose length lies outside 1..M, whose
    prefix is negative, or whose moves would read or write a row outside the cache.
    """
    lens, idx = accepted.length.tolist(), accepted.indices.tolist()
    S, M = kv.shape[-2], accepted.indices.shape[1]
    for b, P in enumerate(prefix_lens.tolist()):
        n = lens[b]
        if not (1 <= n <= M and P >= 0 and P + n <= S and all(0 <= j < S - P for j in idx[b][:n])):
            continue
        src = torch.tensor(idx[b][:n], device=kv.device) + P
        kv[..., b, P:P + n, :] = kv[..., b, :, :].index_select(-2, src)


# ---------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------

_CT = {torch.int32: "int", torch.int64: "long long"}


_NWARPS = 8  # warps of the parallel build (NWARPS in cuda/tree.cu)


def _build_layout(L: int, K: int, budget: int, max_smem: int) -> tuple[int, int]:
    """(dynamic shared memory, cap) of build_tree; the layout is in cuda/tree.cu.

    ``cap`` is the longest node list each warp of the parallel path may build: 4x the budget
    (a wide bracket finds a threshold in one round), at most what fits beside the staged
    log-probs; 0 leaves only the serial heap.
    """
    lp = (L * K * 4 + 15) & ~15
    serial = budget * 12 + (budget + 1) * 12
    cap = min(max(4 * budget, 64), (max_smem - lp - 4096) // (12 * _NWARPS), 65528) // 8 * 8
    cap = cap if cap > budget else 0
    return lp + max(serial, 12 * _NWARPS * cap), cap


@functools.cache
def _max_smem(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def build_tree(logprobs: torch.Tensor, tokens: torch.Tensor, budget: int,
               root_tokens: torch.Tensor | None = None, backend: str = "auto",
               validate: bool = True) -> Tree:
    """Keep the exact top-``budget`` draft prefixes by probability, as a tree.

    Parameters
    ----------
    logprobs : float32 [B, L, K]
        Per-position top-K draft log-probs, each row sorted descending, finite.
        L <= 32, K <= 1024 (K < budget is fine).
    tokens : int32 or int64 [B, L, K]
        The token ids of those log-probs, in 0..2**31 - 1 (the tree holds them as int32).
    budget : int
        Non-root nodes to keep, 1..1024; the tree has N = budget + 1 rows.
    root_tokens : int32 or int64 [B], optional
        Token of node 0 (the previous bonus token), in -1..2**31 - 1; -1 when not given.
    backend : {"auto", "torch", "cuda"}
        "auto" runs the CUDA kernel on CUDA tensors and the reference otherwise.
    validate : bool
        Check the values (finite, sorted, token ids in range). Needs a device synchronisation;
        skipped under CUDA-graph capture. The shape, dtype and device checks always run. With
        False, ids out of range are cast to int32 unchecked.

    Returns
    -------
    Tree
        Bit-identical between backends: same nodes, same order, same visibility.
    """
    _check_build_args(logprobs, tokens, budget, root_tokens, validate)
    if _backend(backend, logprobs.device) == "torch":
        return build_tree_reference(logprobs, tokens, budget, root_tokens)
    return _launch_build(logprobs, tokens, budget, root_tokens)


def _launch_build(logprobs, tokens, budget, root_tokens=None, *, serial: bool = False,
                  path: torch.Tensor | None = None) -> Tree:
    """The CUDA build on checked arguments. ``serial`` runs only the heap (one warp, the v5
    kernel: the benchmark's baseline); ``path`` (int32 [B]) receives the path each sequence
    took (0 parallel; 1, 2 fallbacks to the heap; 3 heap requested), for tests."""
    from kdtree import kernels

    B, L, K = logprobs.shape
    N, dev = budget + 1, logprobs.device
    out_tok = torch.empty((B, N), dtype=torch.int32, device=dev)
    out_par, out_dep = torch.empty_like(out_tok), torch.empty_like(out_tok)
    out_num = torch.empty(B, dtype=torch.int32, device=dev)
    vis = torch.empty((B, N, (N + 63) // 64), dtype=torch.int64, device=dev)
    if root_tokens is not None and root_tokens.dtype != tokens.dtype:
        root_tokens = root_tokens.to(tokens.dtype)
    smem, cap = _build_layout(L, K, budget, _max_smem(dev.index if dev.index is not None else torch.cuda.current_device()))
    serial = serial or cap == 0
    fn = kernels.get_kernel("tree", "build_tree", {"TOKEN_T": _CT[tokens.dtype]}, device=dev.index)
    kernels.launch(fn, (B,), (32 if serial else 32 * _NWARPS,),
                   (kernels.ptr(logprobs), kernels.ptr(tokens),
                    kernels.ptr(root_tokens if root_tokens is not None else tokens),
                    np.int32(root_tokens is not None), np.int32(L), np.int32(K), np.int32(budget),
                    np.int32(0 if serial else cap),
                    kernels.ptr(out_tok), kernels.ptr(out_par), kernels.ptr(out_dep),
                    kernels.ptr(out_num), kernels.ptr(vis), kernels.ptr(path) if path is not None else np.uint64(0)),
                   shared_mem=smem, device=dev)
    return Tree(out_tok, out_par, out_dep, out_num, vis, L)


def _check_accepted_rows(prefix_lens: torch.Tensor, accepted: Accepted, S: int) -> None:
    """compact_kv's value checks: every row the compaction reads or writes lies in the cache.

    Raises ValueError naming the argument and the first sequence that breaks a rule.
    """
    P, n, idx = prefix_lens.long(), accepted.length.long(), accepted.indices.long()
    M = idx.shape[1]
    live = torch.arange(M, device=idx.device) < n[:, None]
    # indices start at 0 and increase, so indices[b, i] >= i: the source rows bound the destinations
    last = P + torch.where(live, idx, 0).amax(1)
    rules = (
        (P < 0, lambda b: f"prefix_lens: negative prefix length {int(P[b])} (sequence {b})"),
        ((n < 1) | (n > M), lambda b: f"accepted.length: must be in 1..{M} (root included), "
                                      f"sequence {b} has {int(n[b])}"),
        (((idx < 0) & live).any(1), lambda b: f"accepted.indices: a negative index (padding) inside "
                                              f"the first length[{b}] = {int(n[b])} entries of sequence {b}"),
        (idx[:, 0] != 0, lambda b: f"accepted.indices: sequence {b} must start at the root (0), "
                                   f"starts at {int(idx[b, 0])}"),
        (((idx[:, 1:] <= idx[:, :-1]) & live[:, 1:]).any(1),
         lambda b: f"accepted.indices: sequence {b} must increase along the walk (a child follows its parent)"),
        (last >= S, lambda b: f"prefix_lens: prefix_lens[{b}] + accepted.indices[{b}] reaches row "
                              f"{int(last[b])}, outside the cache (S = {S})"),
    )
    for bad, message in rules:
        hits = bad.nonzero()
        if hits.numel():
            raise ValueError(message(int(hits[0, 0])))


def _check_tree(tree) -> None:
    if not isinstance(tree, Tree):
        raise TypeError(f"tree: expected a kdtree.Tree, got {type(tree).__name__}")
    check_tensor("tree.tokens", tree.tokens, (torch.int32,), 2)
    B, N = tree.tokens.shape
    check_tensor("tree.parents", tree.parents, (torch.int32,), 2, tree.device)
    check_tensor("tree.num_nodes", tree.num_nodes, (torch.int32,), 1, tree.device)
    if tuple(tree.parents.shape) != (B, N) or tuple(tree.num_nodes.shape) != (B,):
        raise ValueError(f"tree: parents {tuple(tree.parents.shape)} and num_nodes {tuple(tree.num_nodes.shape)} "
                         f"do not match tokens {(B, N)}")
    if not (isinstance(tree.draft_depth, int) and 0 <= tree.draft_depth <= MAX_DEPTH):
        raise ValueError(f"tree.draft_depth: must be an int in 0..{MAX_DEPTH}, got {tree.draft_depth!r}")


def accept_tree(tree: Tree, target_tokens: torch.Tensor, backend: str = "auto",
                validate: bool = True) -> Accepted:
    """Greedy DDTree acceptance.

    Parameters
    ----------
    tree : Tree
    target_tokens : int32 or int64 [B, N]
        The target model's choice (argmax) at every tree node, in 0..2**31 - 1.
    backend : {"auto", "torch", "cuda"}
    validate : bool
        Check that the target's ids fit int32 (``bonus`` is int32). Needs a device
        synchronisation; skipped under CUDA-graph capture.

    Returns
    -------
    Accepted
        From the root, repeatedly move to the child whose token equals the target's choice
        at the current node (the lowest-index one if several do); stop at a node with no
        such child. ``bonus`` is the target's choice there.
    """
    _check_tree(tree)
    check_tensor("target_tokens", target_tokens, _INT, 2)
    if tuple(target_tokens.shape) != tuple(tree.tokens.shape):
        raise ValueError(f"target_tokens: expected shape {tuple(tree.tokens.shape)}, got {tuple(target_tokens.shape)}")
    if target_tokens.device != tree.device:
        raise ValueError(f"target_tokens: on {target_tokens.device}, tree on {tree.device}")
    backend = _backend(backend, tree.device)
    if reads_values(validate, tree.device):
        check_token_ids("target_tokens", target_tokens)
    if backend == "torch":
        return accept_reference(tree, target_tokens)
    from kdtree import kernels

    B, N = tree.tokens.shape
    M, dev = tree.draft_depth + 1, tree.device
    idx = torch.empty((B, M), dtype=torch.int32, device=dev)
    length, bonus = torch.empty(B, dtype=torch.int32, device=dev), torch.empty(B, dtype=torch.int32, device=dev)
    fn = kernels.get_kernel("tree", "accept_tree", {"TARGET_T": _CT[target_tokens.dtype]}, device=dev.index)
    kernels.launch(fn, (B,), (256,),
                   (kernels.ptr(tree.tokens), kernels.ptr(tree.parents), kernels.ptr(tree.num_nodes),
                    kernels.ptr(target_tokens), np.int32(N), np.int32(M),
                    kernels.ptr(idx), kernels.ptr(length), kernels.ptr(bonus)),
                   shared_mem=4 * N, device=dev)
    return Accepted(idx, length, bonus)


def compact_kv(kv: torch.Tensor, prefix_lens: torch.Tensor, accepted: Accepted,
               backend: str = "auto", validate: bool = True) -> None:
    """Move the accepted tree rows behind each prefix, in place.

    Parameters
    ----------
    kv : tensor [B, S, D] or [layers, B, S, D]
        The KV cache (any dtype); the tree rows of sequence b sit at
        ``prefix_lens[b] .. prefix_lens[b] + N - 1``. The last dimension must be contiguous.
    prefix_lens : int32 or int64 [B]
    accepted : Accepted
        Row ``prefix_lens[b] + i`` receives row ``prefix_lens[b] + indices[b, i]`` for
        ``i < length[b]``: ``indices`` int32 [B, M] and ``length`` int32 [B] on kv's device,
        M <= 33, as ``accept_tree`` returns them.
    backend : {"auto", "torch", "cuda"}
    validate : bool
        Check the whole ``accepted`` against ``kv`` and ``prefix_lens`` before the first write:
        ``length[b]`` in 1..M, ``indices[b, :length[b]]`` the root 0 first, increasing (a walk
        down the tree), no -1, every source and destination row inside the cache. Reads the
        values (a device synchronisation; skipped under CUDA-graph capture).

    Notes
    -----
    Without validation neither backend touches a row outside ``0 .. S - 1`` of a sequence: a
    sequence whose ``length`` is outside 1..M, whose prefix is negative, or one of whose first
    ``length`` moves would read or write a row outside the cache is left as it is (skipped
    whole); the other sequences are compacted.
    """
    check_storage("kv", kv)
    if kv.dim() not in (3, 4):
        raise ValueError(f"kv: expected [B, S, D] or [layers, B, S, D], got {tuple(kv.shape)}")
    if kv.stride(-1) != 1:
        raise ValueError("kv: the last dimension must be contiguous")
    if not isinstance(accepted, Accepted):
        raise TypeError(f"accepted: expected a kdtree.Accepted, got {type(accepted).__name__}")
    B, S = kv.shape[-3], kv.shape[-2]
    check_tensor("prefix_lens", prefix_lens, _INT, 1, kv.device)
    check_tensor("accepted.indices", accepted.indices, (torch.int32,), 2, kv.device)
    check_tensor("accepted.length", accepted.length, (torch.int32,), 1, kv.device)
    if prefix_lens.shape[0] != B:
        raise ValueError(f"prefix_lens: expected {B} entries (kv's batch), got {prefix_lens.shape[0]}")
    if accepted.indices.shape[0] != B or accepted.length.shape[0] != B:
        raise ValueError(f"accepted: expected {B} sequences (kv's batch), got {accepted.indices.shape[0]} index rows "
                         f"and {accepted.length.shape[0]} lengths")
    M = accepted.indices.shape[1]
    if not (1 <= M <= MAX_DEPTH + 1):
        raise ValueError(f"accepted.indices: 1..{MAX_DEPTH + 1} indices per row, got {M}")
    backend = _backend(backend, kv.device)
    if reads_values(validate, kv.device):
        _check_accepted_rows(prefix_lens, accepted, S)
    if backend == "torch":
        return compact_kv_reference(kv, prefix_lens, accepted)
    from kdtree import kernels

    esize = kv.element_size()
    row_bytes = kv.shape[-1] * esize
    strides = [s * esize for s in kv.stride()[:-1]] + [kv.data_ptr()]
    word = next(w for w in (16, 8, 4, 2, 1) if row_bytes % w == 0 and all(s % w == 0 for s in strides))
    wt = {16: "uint4", 8: "unsigned long long", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}[word]
    layers = kv.shape[0] if kv.dim() == 4 else 1
    lstride = kv.stride(0) * esize // word if kv.dim() == 4 else 0
    bstride, rstride = kv.stride(-3) * esize // word, kv.stride(-2) * esize // word
    row_words = row_bytes // word
    fn = kernels.get_kernel("tree", "compact_kv", {"WORD_T": wt, "PLEN_T": _CT[prefix_lens.dtype]},
                            device=kv.device.index)
    threads = min(128, max(32, row_words))
    kernels.launch(fn, ((row_words + threads - 1) // threads, B, layers), (threads,),
                   (kernels.ptr(kv), np.int64(lstride), np.int64(bstride), np.int64(rstride),
                    np.int64(S), np.int32(row_words), kernels.ptr(prefix_lens), kernels.ptr(accepted.indices),
                    kernels.ptr(accepted.length), np.int32(M)), device=kv.device)


def topk_logprobs(logits: torch.Tensor, k: int, validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax over the vocabulary, then the top-``k``: how drafter logits reach build_tree.

    Parameters
    ----------
    logits : float tensor [..., V]
        Every row a distribution: no NaN, no +inf, at least one finite value. -inf entries
        (masked tokens) are fine.
    k : int, 1..min(V, 1024)
    validate : bool
        Check the rows (a device synchronisation; skipped under CUDA-graph capture). Without
        it, a row with NaN, +inf or only -inf gives NaN log-probs, which ``build_tree``
        (validate=True) then refuses.

    Returns
    -------
    logprobs : float32 [..., k]
        Sorted descending; the -inf of masked tokens becomes the float32 minimum, so the
        values are finite and ``build_tree`` takes them.
    tokens : int64 [..., k]
    """
    check_storage("logits", logits)
    if not logits.is_floating_point():
        raise TypeError(f"logits: expected a floating dtype, got {logits.dtype}")
    if logits.dim() < 1:
        raise ValueError("logits: needs a vocabulary dimension")
    V = logits.shape[-1]
    if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= min(V, MAX_TOPK)):
        raise ValueError(f"k: must be an int in 1..min(vocab={V}, {MAX_TOPK}), got {k!r}")
    if reads_values(validate, logits.device):
        for bad, what in ((torch.isnan(logits).any(-1), "contains NaN"),
                          (torch.isposinf(logits).any(-1), "contains +inf"),
                          (~torch.isfinite(logits).any(-1), "has no finite value (all -inf, no distribution)")):
            hits = bad.reshape(-1).nonzero()
            if hits.numel():
                row = tuple(int(i) for i in np.unravel_index(int(hits[0, 0]), logits.shape[:-1]))
                raise ValueError(f"logits: row {row} {what}")
    lp = torch.log_softmax(logits.float(), dim=-1)
    vals, idx = torch.topk(lp, k, dim=-1, sorted=True)
    return vals.clamp_min(torch.finfo(torch.float32).min).contiguous(), idx.contiguous()
