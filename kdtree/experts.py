"""The routed experts of an MoE layer on the GPU: ``cuda/moe_grouped.cu`` launched from torch.

``routed_experts`` computes what ``kdtree.engine.model.MoE.experts`` computes with torch ops
(permutation, three grouped GEMMs, SiLU, weighted combine), in four launches:

1. ``moe_permute``: group ends, each local slot's position in expert order, each position's token;
2. the gate and up projections of every local slot in one grouped GEMM, reading the tokens of
   x through the positions' token index (no gathered copy) and writing ``silu(gate) * up``;
3. the down projection (float32 out);
4. ``moe_combine``: each token's local slots, weighted, summed in slot order, plus ``base``
   (the shared expert's output) if given.

The GEMMs stream each touched expert's weights once, tokens on the mma's narrow side: the
shape of expert parallelism at small batch, where an expert sees a few tokens per step. An
expert with more than ``8 * nt`` tokens streams its weights once per chunk of that many. Static
shapes and no host synchronisation: graph-capturable. bf16 CUDA tensors only; the torch path
in ``kdtree.engine.model`` is the reference and the CPU path.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

ROWS_GATED, ROWS_DOWN = 16, 32
# (warps splitting K, cp.async ring depth) per token tiles nt, the best of scripts/moe_dev.py's
# sweep on an H200 (kimi_k2_ep8 layer, own router, T = 1 .. 1025): deeper rings or eight warps
# (one block per SM) were no faster anywhere.
SHAPES = {1: (4, 4), 2: (4, 4), 4: (4, 3)}
_SRC = "moe_grouped"


@functools.lru_cache(maxsize=None)
def _kernel(name: str, index: int, defines: tuple) -> object:
    from kdtree.kernels import get_kernel

    return get_kernel(_SRC, name, dict(defines), device=index)


def chunk_tiles(tokens: int, k: int, experts: int) -> int:
    """Token tiles of 8 per chunk (1, 2 or 4) for ``tokens`` tokens routed top-``k`` over ``experts``.

    Sized for the mean tokens per expert (``tokens k / experts``) with room for its spread, so
    that most experts stream their weights once.
    """
    mean = tokens * k / experts
    return 1 if mean <= 2 else (2 if mean <= 6 else 4)


def smem_bytes(nt: int, ksplit: int, stages: int) -> int:
    """Dynamic shared memory of a grouped-GEMM block: ksplit warps x stages x (8 + 2 nt) x 512 B."""
    return ksplit * stages * (8 + 2 * nt) * 32 * 16


def _check_bf16(name: str, t: torch.Tensor, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda or t.dtype != torch.bfloat16:
        raise TypeError(f"{name}: expected a bf16 CUDA tensor, got {t.dtype} on {t.device}")
    if t.dim() != dim or not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name}: expected a contiguous, 16-byte aligned {dim}-d tensor, got shape "
                         f"{tuple(t.shape)}")


def supported(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, k: int) -> bool:
    """Whether ``routed_experts`` takes these operands (else the torch path runs).

    bf16 CUDA tensors; the hidden width and expert intermediate multiples of 256 (four warps'
    64-wide steps) and of 32 (the row tiles); k <= 8 (the combine's slots per token); at most 1024 local
    experts.
    """
    if not (x.is_cuda and x.dtype == torch.bfloat16 and w1.dtype == torch.bfloat16 and w2.dtype == torch.bfloat16):
        return False
    E, h, d = w1.shape
    return d % 256 == 0 and h % 256 == 0 and k <= 8 and E <= 1024


def permute(expert: torch.Tensor, n_local: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the (token, slot) pairs of ``expert`` [T, k] (int64 global ids) by local expert.

    Experts ``0 .. n_local - 1`` are this GPU's; other ids (other ranks') are left out.

    Returns
    -------
    offs : int32 [n_local]
        Group ends (inclusive cumulative counts).
    rowidx : int32 [T k]
        The token of each position in expert order; positions past ``offs[-1]`` hold 0.
    pos : int32 [T k]
        Each flat slot's position, -1 for other ranks' slots.
    """
    from kdtree.kernels import launch, ptr

    if not isinstance(expert, torch.Tensor) or expert.dtype != torch.int64 or not expert.is_cuda:
        raise TypeError(f"expert: expected an int64 CUDA tensor, got {getattr(expert, 'dtype', type(expert))}")
    if expert.dim() != 2:
        raise ValueError(f"expert: expected [T, k], got shape {tuple(expert.shape)}")
    if not isinstance(n_local, int) or not 1 <= n_local <= 1024:
        raise ValueError(f"n_local: expected an int in 1..1024, got {n_local!r}")
    expert = expert.contiguous()
    S, dev = expert.numel(), expert.device
    offs = torch.empty(n_local, dtype=torch.int32, device=dev)
    rowidx = torch.empty(S, dtype=torch.int32, device=dev)
    pos = torch.empty(S, dtype=torch.int32, device=dev)
    fn = _kernel("moe_permute", dev.index if dev.index is not None else torch.cuda.current_device(), ())
    launch(fn, (1,), (1024,), (ptr(expert), np.int32(S), np.int32(expert.shape[1]), np.int32(n_local),
                               ptr(offs), ptr(rowidx), ptr(pos)), device=dev)
    return offs, rowidx, pos


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, rows: int, *,
                 up: torch.Tensor | None = None, rowidx: torch.Tensor | None = None, nt: int = 1,
                 shape: tuple[int, int] | None = None) -> torch.Tensor:
    """``out[p] = x[row(p)] @ w[e].T`` for the positions p of each expert e, as a weight stream.

    Parameters
    ----------
    x : bf16 [R, K]
        Activations; position p reads row ``rowidx[p]`` (or row p without ``rowidx``).
    w : bf16 [E, N, K]
        Expert weights (gate, or down).
    offs : int32 [E]
        Group ends: expert e owns positions ``offs[e-1] .. offs[e] - 1``.
    rows : int
        Positions to allocate (static; rows past ``offs[-1]`` are left undefined).
    up : bf16 [E, N, K], optional
        With it the output is ``silu(x w^T) * (x up^T)`` in bf16 (gate and up in one pass);
        without, ``x w^T`` in float32.
    rowidx : int32 [rows], optional
    nt : int
        Token tiles of 8 per chunk (``chunk_tiles``).
    shape : (ksplit, stages), optional
        Warps splitting K and ring depth; default ``SHAPES[nt]``.

    Returns
    -------
    tensor [rows, N]: bf16 with ``up``, float32 without.
    """
    from kdtree.kernels import launch, ptr

    _check_bf16("x", x, 2)
    _check_bf16("w", w, 3)
    E, N, K = w.shape
    if up is not None:
        _check_bf16("up", up, 3)
        if up.shape != w.shape:
            raise ValueError(f"up: expected the shape of w {tuple(w.shape)}, got {tuple(up.shape)}")
    if nt not in SHAPES:
        raise ValueError(f"nt: expected one of {sorted(SHAPES)}, got {nt!r}")
    ksplit, stages = SHAPES[nt] if shape is None else shape
    if ksplit not in (1, 2, 4, 8) or not 2 <= stages <= 8 or smem_bytes(nt, ksplit, stages) > 227 * 1024:
        raise ValueError(f"shape: expected ksplit in (1, 2, 4, 8), stages in 2..8 within 227 KB, got {shape}")
    tile = ROWS_GATED if up is not None else ROWS_DOWN
    if x.shape[1] != K or K % (64 * ksplit) or N % tile:
        raise ValueError(f"x, w: expected x [R, K] and w [E, N, K] with K % {64 * ksplit} == 0 and "
                         f"N % {tile} == 0, got {tuple(x.shape)} and {tuple(w.shape)}")
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.shape != (E,) or offs.device != w.device:
        raise ValueError(f"offs: expected int32 [{E}] on {w.device}")
    if rowidx is not None and (rowidx.dtype != torch.int32 or rowidx.dim() != 1 or rowidx.shape[0] < rows):
        raise ValueError(f"rowidx: expected int32 [>= {rows}], got {rowidx.dtype} {tuple(rowidx.shape)}")
    if x.device != w.device:
        raise ValueError(f"x: expected the device of w ({w.device}), got {x.device}")
    out = torch.empty(rows, N, device=x.device, dtype=torch.bfloat16 if up is not None else torch.float32)
    if rows == 0:
        return out
    idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
    defines = (("MOE_GATED", int(up is not None)), ("MOE_K", K), ("MOE_KSPLIT", ksplit), ("MOE_NT", nt),
               ("MOE_STAGES", stages))
    fn = _kernel("moe_grouped_gemm", idx, defines)
    launch(fn, (N // tile, E), (32 * ksplit,),
           (ptr(x), np.uint64(0) if rowidx is None else ptr(rowidx), ptr(w), ptr(w if up is None else up), ptr(offs),
            ptr(out), np.int32(N)), shared_mem=smem_bytes(nt, ksplit, stages), device=x.device)
    return out


def combine(ys: torch.Tensor, pos: torch.Tensor, weight: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = base[t] + sum_s weight[t, s] ys[pos[t, s]]`` over slots with ``pos >= 0``, float32 sums.

    ``ys`` float32 [P, dim] (dim % 4 == 0), ``pos`` int32 [T k], ``weight`` float32 [T, k]
    (k <= 8), ``base`` bf16 [T, dim] or None. Returns bf16 [T, dim].
    """
    from kdtree.kernels import launch, ptr

    if ys.dtype != torch.float32 or ys.dim() != 2 or not ys.is_contiguous() or ys.shape[1] % 4:
        raise ValueError(f"ys: expected contiguous float32 [P, dim] with dim % 4 == 0, got {ys.dtype} {tuple(ys.shape)}")
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] > 8:
        raise ValueError(f"weight: expected float32 [T, k <= 8], got {weight.dtype} {tuple(weight.shape)}")
    T, k = weight.shape
    if pos.dtype != torch.int32 or pos.numel() != T * k:
        raise ValueError(f"pos: expected int32 [{T * k}], got {pos.dtype} {tuple(pos.shape)}")
    D = ys.shape[1]
    if base is not None:
        _check_bf16("base", base, 2)
        if base.shape != (T, D):
            raise ValueError(f"base: expected [{T}, {D}], got {tuple(base.shape)}")
    out = torch.empty(T, D, device=ys.device, dtype=torch.bfloat16)
    if T == 0:
        return out
    idx = ys.device.index if ys.device.index is not None else torch.cuda.current_device()
    fn = _kernel("moe_combine", idx, (("MOE_TOPK", k),))
    launch(fn, (T,), (256,), (ptr(ys), ptr(pos.contiguous()), ptr(weight.contiguous()),
                              np.uint64(0) if base is None else ptr(base), ptr(out), np.int32(D)), device=ys.device)
    return out


def routed_experts(x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                   w2: torch.Tensor, base: torch.Tensor | None = None, experts_total: int | None = None) -> torch.Tensor:
    """The weighted sum [T, dim] of each token's local experts (``MoE.experts``), plus ``base``.

    Parameters
    ----------
    x : bf16 [T, dim]
    weight : float32 [T, k]
        Routing weights.
    expert : int64 [T, k]
        Global expert ids; ids >= E (``w1.shape[0]``) belong to other ranks and are skipped.
    w1, w3 : bf16 [E, inter, dim]
        Gate and up projections.
    w2 : bf16 [E, dim, inter]
        Down projection.
    base : bf16 [T, dim], optional
        Added to the sum (the shared expert's output).
    experts_total : int, optional
        Global experts the router chooses from (sizes the token chunks); default E.
    """
    _check_bf16("x", x, 2)
    for name, w in (("w1", w1), ("w3", w3), ("w2", w2)):
        _check_bf16(name, w, 3)
    E, h, d = w1.shape
    if x.shape[1] != d or w3.shape != w1.shape or w2.shape != (E, d, h):
        raise ValueError(f"x, w1, w3, w2: expected x [T, {d}], w3 {tuple(w1.shape)}, w2 [{E}, {d}, {h}], got "
                         f"{tuple(x.shape)}, {tuple(w3.shape)}, {tuple(w2.shape)}")
    if weight.shape != expert.shape or weight.shape[0] != x.shape[0]:
        raise ValueError(f"weight, expert: expected [T={x.shape[0]}, k] each, got {tuple(weight.shape)}, "
                         f"{tuple(expert.shape)}")
    T, k = expert.shape
    nt = chunk_tiles(T, k, experts_total or E)
    offs, rowidx, pos = permute(expert, E)
    hid = grouped_gemm(x, w1, offs, T * k, up=w3, rowidx=rowidx, nt=nt)
    ys = grouped_gemm(hid, w2, offs, T * k, nt=nt)
    return combine(ys, pos, weight.float(), base)


def reference_grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, rowidx: torch.Tensor | None = None,
                      up: torch.Tensor | None = None) -> torch.Tensor:
    """``grouped_gemm`` in float64 on the host (positions past ``offs[-1]`` are zero)."""
    offs = offs.cpu().long().tolist()
    xd, wd = x.double().cpu(), w.double().cpu()
    ud = None if up is None else up.double().cpu()
    rows = offs[-1] if offs else 0
    out = torch.zeros(rows, w.shape[1], dtype=torch.float64)
    first = 0
    for e, end in enumerate(offs):
        idx = torch.arange(first, end) if rowidx is None else rowidx[first:end].long().cpu()
        xe = xd[idx]
        if ud is None:
            out[first:end] = xe @ wd[e].T
        else:
            g = xe @ wd[e].T
            out[first:end] = g / (1 + torch.exp(-g)) * (xe @ ud[e].T)
        first = end
    return out

