"""FLOP and byte models of kdtree's kernels, per variant.

Each model gives the useful FLOPs, the algorithmic minimum of bytes (every input read once,
every output written once) and the bytes the variant actually moves through the memory
system, plus which compute unit it runs on and how many launches one call takes. The roofline
(``kdtree.bench.roofline``) turns these into attainable times against measured ceilings.

Verify attention (MLA absorb, DESIGN.md): per (query row x head x visible token) the scores
take 2 * 576 FLOPs and the value product 2 * 512, so 2 * (576 + 512) = 2176; a KV row is 576
bf16 values (1152 bytes) shared by all heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KV_DIM = 576          # latent 512 + rope 64
V_DIM = 512           # output width per head
BF16 = 2
KV_ROW_BYTES = KV_DIM * BF16
ATTN_FLOPS_PER_TOKEN = 2 * (KV_DIM + V_DIM)


@dataclass(frozen=True)
class Cost:
    """What one call of a kernel variant does.

    Attributes
    ----------
    flops : float
        Useful floating-point operations (masked work not counted).
    bytes_min : float
        Algorithmic minimum traffic: each input read once, each output written once.
    bytes_moved : float
        What the variant moves through L2 (re-reads, intermediates).
    compute : str
        ``"tensor"`` (bf16 tensor cores), ``"fp32"`` (CUDA-core FMA) or ``"none"``.
    launches : int
        Kernel launches per call (each pays the launch floor).
    note : str
        Why the variant moves what it moves; the first clause of the diagnosis.
    """

    flops: float
    bytes_min: float
    bytes_moved: float
    compute: str
    launches: int
    note: str

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (0 for kernels that do no arithmetic)."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0

    @property
    def reread(self) -> float:
        """How many times the minimum traffic the variant moves."""
        return self.bytes_moved / self.bytes_min if self.bytes_min else float("nan")


def _positive(**kw) -> None:
    for name, v in kw.items():
        if v is None or not (isinstance(v, (int, float)) and math.isfinite(v)) or v < 0:
            raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")


def verify_attention_cost(variant: str, *, batch: int, nodes: int, heads: int, prefix: int,
                          tree_visible: float | None = None) -> Cost:
    """FLOPs and bytes of one tree-verify MLA attention call.

    Parameters
    ----------
    variant : str
        ``naive``, ``cascade``, ``fused`` (or ``fused_*``), ``torch``; other names get the
        minimum bytes and a note saying no byte model exists for them.
    batch, nodes, heads, prefix : int
        B, N (= budget + 1 = q_len), H (heads on this GPU) and P (prefix length).
    tree_visible : float, optional
        Mean number of tree nodes a node sees (its ancestors and itself). Defaults to
        (N + 1) / 2, the causal-mask average; pass the tree's mean depth + 1 when known.

    Returns
    -------
    Cost
    """
    _positive(batch=batch, nodes=nodes, heads=heads, prefix=prefix)
    if nodes < 1 or heads < 1:
        raise ValueError(f"nodes and heads must be >= 1, got nodes={nodes}, heads={heads}")
    tv = (nodes + 1) / 2 if tree_visible is None else float(tree_visible)
    if not 1 <= tv <= nodes:
        raise ValueError(f"tree_visible: expected 1..{nodes}, got {tree_visible!r}")
    rows = batch * nodes * heads                       # (query row x head) pairs
    visible = prefix + tv                              # KV tokens each row attends to
    flops = rows * visible * ATTN_FLOPS_PER_TOKEN
    q = rows * KV_DIM * BF16
    out = rows * V_DIM * BF16 + rows * 4               # bf16 output + fp32 lse
    kv = batch * (prefix + nodes) * KV_ROW_BYTES
    vis = batch * nodes * math.ceil(nodes / 64) * 8
    bytes_min = q + out + kv + vis
    if variant == "naive":
        moved = q + out + vis + rows * visible * KV_ROW_BYTES
        return Cost(flops, bytes_min, moved, "fp32", 1,
                    f"re-reads the latent per head and query ({moved / bytes_min:.0f}x the minimum bytes)")
    if variant == "cascade":
        partials = 2 * rows * (V_DIM * 4 + 4)          # fp32 out + lse of each pass
        moved = bytes_min + 2 * partials               # written by the passes, read by the merge
        return Cost(flops, bytes_min, moved, "tensor", 3,
                    "prefix pass + tree pass + lse merge (3 launches, fp32 partials)")
    if variant.startswith("fused"):                   # fused and its kernel-forced forms (fused_mma)
        return Cost(flops, bytes_min, bytes_min, "tensor", 1, "single pass on tensor cores")
    if variant == "torch":
        scores = batch * heads * nodes * (prefix + nodes) * 4
        moved = bytes_min + kv * V_DIM / KV_DIM + 4 * scores
        return Cost(flops, bytes_min, moved, "fp32", 8,
                    "float32 reference: materialises the score matrix")
    return Cost(flops, bytes_min, bytes_min, "tensor", 1,
                f"no byte model for variant {variant!r}; minimum bytes assumed")


def build_tree_cost(variant: str, *, batch: int, budget: int, depth: int, topk: int | None = None) -> Cost:
    """Bytes of one tree build (a heap walk: no floating-point work to speak of).

    The heap touches at most ``2 * budget + 1`` of the ``depth x topk`` log-prob entries per
    sequence (each pop pushes a sibling and a child), reading a float32 log-prob and a token id
    each, and writes tokens, parents, depth (int32) and the visibility bitmask of N nodes.
    """
    _positive(batch=batch, budget=budget, depth=depth)
    topk = budget if topk is None else topk
    n = budget + 1
    read = batch * min(depth * topk, 2 * budget + 1) * 8
    write = batch * (n * 12 + 4 + n * math.ceil(n / 64) * 8)
    return Cost(0.0, read + write, read + write, "none", 1,
                "sequential best-first heap, one block per sequence")


def accept_tree_cost(variant: str, *, batch: int, budget: int, depth: int) -> Cost:
    """Bytes of one accept walk: tree tokens, parents and target tokens in, indices out."""
    _positive(batch=batch, budget=budget, depth=depth)
    n = budget + 1
    moved = batch * (3 * n * 4 + (depth + 1) * 4 + 8)
    return Cost(0.0, moved, moved, "none", 1, "pointer-chasing walk from the root")


def compact_kv_cost(variant: str, *, batch: int, depth: int, accepted: float | None = None) -> Cost:
    """Bytes of one KV compaction: each accepted row (576 bf16) read and written once.

    ``accepted`` is the mean accepted length (root included); default ``depth + 1``, the most.
    """
    _positive(batch=batch, depth=depth)
    rows = (depth + 1) if accepted is None else accepted
    moved = 2 * batch * rows * KV_ROW_BYTES
    return Cost(0.0, moved, moved, "none", 1, "row copy of the accepted KV")


def accept_compact_cost(variant: str, *, batch: int, budget: int, depth: int,
                        accepted: float | None = None) -> Cost:
    """Accept walk followed by KV compaction, as one step (two launches)."""
    a = accept_tree_cost(variant, batch=batch, budget=budget, depth=depth)
    c = compact_kv_cost(variant, batch=batch, depth=depth, accepted=accepted)
    return Cost(0.0, a.bytes_min + c.bytes_min, a.bytes_moved + c.bytes_moved, "none", 2,
                "accept walk, then row copy of the accepted KV")


MODELS = {
    "verify_attention": verify_attention_cost,
    "build_tree": build_tree_cost,
    "accept_tree": accept_tree_cost,
    "compact_kv": compact_kv_cost,
    "accept+compact": accept_compact_cost,
}

# Result-table column -> model argument, per kernel; optional ones may be absent.
_ARGS = {
    "verify_attention": {"batch": "batch", "nodes": "q_len", "heads": "heads", "prefix": "prefix",
                         "tree_visible": "tree_visible?"},
    "build_tree": {"batch": "batch", "budget": "budget", "depth": "depth", "topk": "topk?"},
    "accept_tree": {"batch": "batch", "budget": "budget", "depth": "depth"},
    "compact_kv": {"batch": "batch", "depth": "depth", "accepted": "accepted?"},
    "accept+compact": {"batch": "batch", "budget": "budget", "depth": "depth", "accepted": "accepted?"},
}
_ALIASES = {"build": "build_tree", "tree_build": "build_tree", "accept": "accept_tree", "compact": "compact_kv",
            "compaction": "compact_kv", "attention": "verify_attention", "verify": "verify_attention"}


def kernel_name(name: str) -> str:
    """Canonical kernel name: ``build_tree``, ``accept_tree``, ``compact_kv``, ``accept+compact``
    or ``verify_attention`` (the benches' short names ``build``, ``accept``, ``compact`` map here)."""
    return _ALIASES.get(name, name)


def cost_for_row(row) -> Cost | None:
    """The cost of one result row (a mapping with ``kernel``, ``variant`` and shape columns).

    ``q_len`` may be given as ``budget`` (q_len = budget + 1) and ``depth`` defaults to 15.
    Returns None for kernels without a model.
    """
    kernel = kernel_name(str(row.get("kernel")))
    if kernel not in MODELS:
        return None
    variant = row.get("variant") if _present(row.get("variant")) else row.get("path", "?")
    values = dict(row)
    if not _present(values.get("q_len")) and _present(values.get("budget")):
        values["q_len"] = int(values["budget"]) + 1
    if not _present(values.get("depth")):
        values["depth"] = 15
    kwargs = {}
    for arg, col in _ARGS[kernel].items():
        optional = col.endswith("?")
        col = col.rstrip("?")
        if _present(values.get(col)):
            kwargs[arg] = float(values[col]) if arg in ("tree_visible", "accepted") else int(values[col])
        elif not optional:
            raise ValueError(f"{kernel} row needs column {col!r} for its cost model; row has {sorted(values)}")
    return MODELS[kernel](str(variant), **kwargs)


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))
