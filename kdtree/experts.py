"""An MoE layer on the GPU: ``cuda/moe_router_mma.cu`` (or ``cuda/moe_router.cu``) and
``cuda/moe_grouped.cu`` launched from torch.

``route`` is ``kdtree.engine.model.MoE.route`` (float32 gate, sigmoid, top-k, renormalised and
scaled weights) in one launch. ``routed_experts`` computes what ``MoE.experts`` computes with
torch ops (permutation, three grouped GEMMs, SiLU, weighted combine, and the shared expert) in
four launches, each a programmatic dependent launch (``kdtree.kernels.launch``) that starts
while the one before it runs and waits for it before it reads its outputs:

1. ``moe_permute``: group ends, each local slot's position in expert order, each position's token;
2. the gate and up projections of every local slot, and of every token through the shared
   expert (an extra group after the routed slots), in one grouped GEMM, reading the tokens of
   x through the positions' token index (no gathered copy) and writing ``silu(gate) * up``;
3. the down projection of the same positions (float32 out);
4. ``moe_combine``: each token's local slots, weighted, summed in slot order, plus its shared
   expert row.

The GEMMs stream each touched expert's weights once, tokens on the mma's narrow side: the
shape of expert parallelism at small batch, where an expert sees a few tokens per step. An
expert with more than ``8 * nt`` tokens streams its weights once per chunk of that many (the
shared expert's chunks run side by side, one grid row each). Static shapes and no host
synchronisation: graph-capturable. bf16 CUDA tensors only (the router's gate in float32); the
torch path in ``kdtree.engine.model`` is the reference and the CPU path.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

ROWS_GATED, ROWS_DOWN = 16, 32
ROUTER_THREADS = 256
ROUTER_COUNTERS = 4096   # token tiles a launch can count in the cached buffer (more: a fresh one)
# The layer takes the router kernel up to this many tokens: on an H200 (scripts/moe_dev.py,
# results/moe/h200_05_bded7e8/dev.log) the "fma" kernel took 9.3 / 18.6 / 40.8 us at
# T = 1 / 17 / 65 against the torch router's 27.2 / 41.3 / 53.6, but 103 / 343 us at
# T = 257 / 1025 against 87 / 210: past ~128 tokens its float32 FMAs and its re-reads of x from
# L2 lose to cuBLAS's GEMM.
ROUTER_MAX_TOKENS = 128
# The router kernel ``route`` launches by default: "mma" (cuda/moe_router_mma.cu: split-K over
# all tokens on tensor cores, the gate as three bf16 terms) or "fma" (cuda/moe_router.cu: float32
# FMAs, gate rows in registers per 8-token tile). On an H200 (scripts/moe_dev.py,
# results/moe/router_v2_h200/router_bench.log, graph replay, warm L2) "mma" took 7.4 / 9.6 / 16.2
# / 18.4 us at T = 1 / 17 / 65 / 128 against "fma"'s 8.4 / 17.9 / 40.1 / 68.0 and the torch
# router's 25.3 / 39.8 / 51.6 / 55.4 (T > 128 not measured with "mma": the cap above stays).
ROUTER_KERNEL = "mma"
ROUTER_SLICES = 16       # the mma router's K slices (blocks per expert tile)
ROUTER_FUSED_PERMUTE = 4  # up to this many tokens the mma router's one finaliser also permutes (ROUTER_TF)
# (warps splitting K, cp.async ring depth) per token tiles nt, the best of scripts/moe_dev.py's
# sweep on an H200 (kimi_k2_ep8 layer, own router, T = 1 .. 1025): deeper rings or eight warps
# (one block per SM) were no faster anywhere.
SHAPES = {1: (4, 4), 2: (4, 4), 4: (4, 3)}
# The layer's gate/up GEMM at up to GATE_UP_SMALL_T tokens: eight warps, three stages (one block
# per SM), where K is a multiple of 512. On an H200 (scripts/moe_dev.py gushape,
# results/moe/t1_h200/gushape_478cc86.log, kimi_k2_ep8, the shape up to 8, up to 1 and never,
# alternating in one process) the layer took 39.9-40.0 us against 41.6-42.5 at T = 1, the same
# at T = 2, and 111.6-111.8 against 106.6-107.1 at T = 4 and 213.2-213.4 against 208.6 at T = 8.
GATE_UP_SMALL_T = 1
GATE_UP_SMALL_SHAPE = (8, 3)
_SRC = "moe_grouped"
_COUNTERS: dict[int, torch.Tensor] = {}


@functools.lru_cache(maxsize=None)
def _kernel(name: str, index: int, defines: tuple, src: str = _SRC) -> object:
    from kdtree.kernels import get_kernel

    return get_kernel(src, name, dict(defines), device=index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def chunk_tiles(tokens: int, k: int, experts: int) -> int:
    """Token tiles of 8 per chunk (1, 2 or 4) for ``tokens`` tokens routed top-``k`` over ``experts``.

    Sized for the mean tokens per expert (``tokens k / experts``) with room for its spread, so
    that most experts stream their weights once.
    """
    mean = tokens * k / experts
    return 1 if mean <= 2 else (2 if mean <= 6 else 4)


def expected_distinct(tokens: int, k: int, experts: int, local: int) -> float:
    """Expected distinct local experts touched by ``tokens`` tokens under uniform top-k routing.

    Each token picks a uniform random ``k``-subset of ``experts``, so a given expert escapes
    one token with probability ``1 - k / experts`` and all of them with its ``tokens``-th power:
    ``local * (1 - (1 - k / experts) ** tokens)``.
    """
    for name, v in (("tokens", tokens), ("k", k), ("experts", experts), ("local", local)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    if not 1 <= k <= experts or local > experts:
        raise ValueError(f"k, local: expected 1 <= k <= experts and local <= experts, got {k}, {local}, {experts}")
    return local * (1.0 - (1.0 - k / experts) ** tokens)


def gate_up_shape(tokens: int, dim: int) -> tuple[int, int] | None:
    """(warps, ring depth) of the layer's gate/up GEMM for ``tokens`` tokens of width ``dim``:
    ``GATE_UP_SMALL_SHAPE`` up to ``GATE_UP_SMALL_T`` tokens where ``dim`` divides into its warps'
    64-wide steps, else None (``SHAPES``)."""
    warps = GATE_UP_SMALL_SHAPE[0]
    return GATE_UP_SMALL_SHAPE if tokens <= GATE_UP_SMALL_T and dim % (64 * warps) == 0 else None


def layer_gemm_options(tokens: int, k: int, experts_total: int, experts_local: int, dim: int) -> tuple[dict, dict]:
    """The keyword options of an MoE layer's gate/up and down ``grouped_gemm`` calls beyond its
    tensors (``routed_experts`` and ``kdtree.bench.moe.stage_breakdown`` both take them from here):
    token tiles ``nt`` (``chunk_tiles``), the shared expert's first position ``tokens k``,
    ``groups = min(experts_local, tokens k)`` (at most that many local experts have tokens), the
    routed grid rows ``rows_routed``: the local experts the tokens touch on average under uniform
    routing (``expected_distinct``, rounded up; each row walks the list of experts with tokens,
    so more experts mean more work per block, fewer mean no empty blocks), and for gate/up its
    ``shape`` (``gate_up_shape``).
    """
    groups = min(experts_local, tokens * k)
    # less a hair: at T = 1 the expectation is k E_local / E, 1.0 up to rounding
    rows = min(groups, max(1, math.ceil(expected_distinct(tokens, k, experts_total, experts_local) - 1e-6)))
    down = {"nt": chunk_tiles(tokens, k, experts_total), "shared_first": tokens * k, "groups": groups,
            "rows_routed": rows}
    return down | {"shape": gate_up_shape(tokens, dim)}, down


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


def supported(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, k: int, shared_inter: int = 0) -> bool:
    """Whether ``routed_experts`` takes these operands (else the torch path runs).

    bf16 CUDA tensors; the hidden width, the expert intermediate and the shared expert's
    intermediate (``shared_inter``, 0: none) multiples of 256 (four warps' 64-wide steps) and
    of 32 (the row tiles), the shared one at most the routed one; k <= 8 (the combine's slots
    per token); at most 1024 local experts.
    """
    if not (x.is_cuda and x.dtype == torch.bfloat16 and w1.dtype == torch.bfloat16 and w2.dtype == torch.bfloat16):
        return False
    E, h, d = w1.shape
    return (d % 256 == 0 and h % 256 == 0 and shared_inter % 256 == 0 and shared_inter <= h and k <= 8
            and E <= 1024)


def router_supported(x: torch.Tensor, gate: torch.Tensor, k: int) -> bool:
    """Whether the layer routes x through ``route`` (else the torch path runs): x bf16 [T, dim]
    (contiguous, 16-byte aligned, T <= ``ROUTER_MAX_TOKENS``, where the kernel is the faster)
    and the gate float32 [E, dim] (contiguous) on CUDA, dim a multiple of 1024, E a multiple of
    32, 1 <= k <= min(32, E). ``route`` itself takes any T."""
    if not (x.is_cuda and x.dtype == torch.bfloat16 and gate.is_cuda and gate.dtype == torch.float32
            and x.dim() == 2 and gate.dim() == 2 and x.is_contiguous() and gate.is_contiguous()
            and x.data_ptr() % 16 == 0 and x.shape[0] <= ROUTER_MAX_TOKENS):
        return False
    E, d = gate.shape
    return x.shape[1] == d and d % (4 * ROUTER_THREADS) == 0 and E % 32 == 0 and 1 <= k <= min(32, E)


def router_shape(tokens: int) -> tuple[int, int]:
    """(experts per block, tokens per block) of ``route`` for ``tokens`` tokens: four experts per
    block (96 blocks for Kimi K2's 384), 8-token tiles up to 128 tokens, 64-token tiles beyond
    (each tile re-reads the gate from L2). The best of ``scripts/moe_dev.py``'s shapes at every
    T it measured on an H200 (two experts per block, two blocks per SM, was slower at each)."""
    return 4, (8 if tokens <= ROUTER_MAX_TOKENS else 64)


def router_mma_shape(tokens: int, experts: int) -> tuple[int, int]:
    """(m-tiles of 16 experts per block, n-tiles of 8 tokens per pass) of the "mma" router for
    ``tokens`` tokens over ``experts`` experts (a multiple of 32): three m-tiles where they divide
    the experts (Kimi K2's 384: 8 expert tiles x ``ROUTER_SLICES`` K slices = 128 blocks, one
    wave on an H200's 132 SMs), else two; the n-tiles cover the tokens, at most 8 (64 tokens) per
    pass."""
    return (3 if experts % 48 == 0 else 2), max(1, min(8, -(-tokens // 8)))


def _tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 counters for ``tiles`` token tiles: the device's cached buffer (each router
    launch leaves its counters at zero), or a fresh ``torch.zeros`` (one memset) when the buffer is
    too small or cannot be made now (inside a graph capture, where a new tensor is not zeroed
    until replay). Launches on one stream in order share it; concurrent streams must not."""
    idx = _index(device)
    buf = _COUNTERS.get(idx)
    if buf is None and not torch.cuda.is_current_stream_capturing():
        buf = _COUNTERS[idx] = torch.zeros(ROUTER_COUNTERS, dtype=torch.int32, device=device)
    if buf is None or tiles > buf.numel():
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    return buf


def route(x: torch.Tensor, gate: torch.Tensor, k: int, scale: float,
          shape: tuple[int, int] | None = None, kernel: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing of x [T, dim] in one launch: float32 scores ``sigmoid(x gate^T)``, each
    token's top ``k`` (score descending, ties to the lowest expert id), weights renormalised to
    sum 1 and multiplied by ``scale``. Equal gate rows give bitwise-equal scores in both kernels.

    Parameters
    ----------
    x : bf16 [T, dim] CUDA
    gate : float32 [E, dim] CUDA
        The router's weight (``router_supported``: dim % 1024 == 0, E % 32 == 0).
    k : int
        Experts per token, 1 .. min(32, E).
    scale : float
        The routed scaling factor.
    shape : (experts per block, tokens per block), optional
        The "fma" kernel's; default ``router_shape(T)``; experts per block 2 or 4, tokens per
        block a multiple of 8.
    kernel : "mma" or "fma", optional
        Default ``ROUTER_KERNEL``: "mma" (``cuda/moe_router_mma.cu``, shaped by
        ``router_mma_shape``) or "fma" (``cuda/moe_router.cu``).

    Returns
    -------
    weight : float32 [T, k]
        In the order of the ids.
    expert : int64 [T, k]
        Global expert ids, best first.
    """
    return _route(x, gate, k, scale, *_route_args(x, gate, k, scale, shape, kernel))


def _route_args(x, gate, k, scale, shape, kernel) -> tuple[tuple[int, int], str]:
    """``route``'s argument checks; returns the fma shape and the kernel."""
    _check_bf16("x", x, 2)
    if not isinstance(gate, torch.Tensor) or not gate.is_cuda or gate.dtype != torch.float32 or gate.dim() != 2 \
            or not gate.is_contiguous():
        raise TypeError(f"gate: expected a contiguous float32 CUDA tensor [E, dim], got "
                        f"{getattr(gate, 'dtype', type(gate))} {tuple(getattr(gate, 'shape', ()))}")
    E, d = gate.shape
    if x.shape[1] != d or d % (4 * ROUTER_THREADS) or E % 32:
        raise ValueError(f"x, gate: expected x [T, dim] and gate [E, dim] with dim % 1024 == 0 and E % 32 == 0, "
                         f"got {tuple(x.shape)} and {tuple(gate.shape)}")
    if x.device != gate.device:
        raise ValueError(f"x: expected the device of gate ({gate.device}), got {x.device}")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= min(32, E):
        raise ValueError(f"k: expected an int in 1..{min(32, E)}, got {k!r}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"scale: expected a float, got {type(scale).__name__}")
    kernel = ROUTER_KERNEL if kernel is None else kernel
    if kernel not in ("mma", "fma"):
        raise ValueError(f"kernel: expected 'mma' or 'fma', got {kernel!r}")
    if shape is not None and kernel != "fma":
        raise ValueError(f"shape: only the 'fma' kernel takes a shape, got {shape!r} with kernel {kernel!r}")
    T = x.shape[0]
    eb, tile = router_shape(T) if shape is None else shape
    if eb not in (2, 4) or not isinstance(tile, int) or tile < 8 or tile % 8:
        raise ValueError(f"shape: expected (2 or 4, a positive multiple of 8), got {shape!r}")
    return (eb, tile), kernel


def _route(x, gate, k, scale, shape, kernel, perm=None):
    """``route``'s launch on checked arguments; ``perm``: (n_local, offs, rowidx, pos, active) for
    the mma router's finaliser to fill as ``permute`` does (T <= ``ROUTER_FUSED_PERMUTE``)."""
    from kdtree.kernels import launch, ptr

    (T, d), E = x.shape, gate.shape[0]
    weight = torch.empty(T, k, dtype=torch.float32, device=x.device)
    expert = torch.empty(T, k, dtype=torch.int64, device=x.device)
    if T == 0:
        return weight, expert
    if kernel == "mma":
        mt, nt = router_mma_shape(T, E)
        part = torch.empty(ROUTER_SLICES, T, E, dtype=torch.float32, device=x.device)
        fn = _kernel("moe_router_mma", _index(x.device), (("ROUTER_D", d), ("ROUTER_E", E), ("ROUTER_K", k),
                     ("ROUTER_MT", mt), ("ROUTER_NT", nt), ("ROUTER_S", ROUTER_SLICES)), "moe_router_mma")
        n_local, *outs = perm if perm is not None else (0, None, None, None, None)
        launch(fn, (ROUTER_SLICES * E // (16 * mt),), (32 * 4 * mt,),
               (ptr(x), ptr(gate), ptr(part), ptr(_tile_counters(x.device, 2)), ptr(weight), ptr(expert),
                np.int32(T), np.float32(scale), np.int32(n_local),
                *(np.uint64(0) if t is None else ptr(t) for t in outs)), device=x.device, pdl=True)
        return weight, expert
    eb, tile = shape
    tiles = -(-T // tile)
    scores = torch.empty(T, E, dtype=torch.float32, device=x.device)
    done = _tile_counters(x.device, tiles)
    fn = _kernel("moe_router", _index(x.device), (("ROUTER_D", d), ("ROUTER_E", E), ("ROUTER_EB", eb), ("ROUTER_K", k)),
                 "moe_router")
    launch(fn, (E // eb, tiles), (ROUTER_THREADS,),
           (ptr(x), ptr(gate), ptr(scores), ptr(done), ptr(weight), ptr(expert), np.int32(T), np.int32(tile),
            np.float32(scale)), device=x.device)
    return weight, expert


def _check_n_local(n_local) -> None:
    if not isinstance(n_local, int) or isinstance(n_local, bool) or not 1 <= n_local <= 1024:
        raise ValueError(f"n_local: expected an int in 1..1024, got {n_local!r}")


def _permutation(slots: int, n_local: int, device) -> tuple[torch.Tensor, ...]:
    """Empty (offs, rowidx, pos, active) for ``slots`` slots over ``n_local`` experts."""
    return (torch.empty(n_local, dtype=torch.int32, device=device), torch.empty(slots, dtype=torch.int32, device=device),
            torch.empty(slots, dtype=torch.int32, device=device), torch.empty(n_local, dtype=torch.int32, device=device))


def router_permutes(tokens: int) -> bool:
    """Whether ``route_permuted`` of ``tokens`` tokens is one launch (the default router is the
    "mma" one and 1 <= tokens <= ``ROUTER_FUSED_PERMUTE``)."""
    return ROUTER_KERNEL == "mma" and 1 <= tokens <= ROUTER_FUSED_PERMUTE


def route_permuted(x: torch.Tensor, gate: torch.Tensor, k: int, scale: float, n_local: int
                   ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """``route`` (default kernel), then ``permute`` of its choice over the local experts
    ``0 .. n_local - 1``: where T <= ``ROUTER_FUSED_PERMUTE`` on the "mma" router, in one launch
    (the router's one finaliser groups the slots it has chosen; at one token on an H200 the
    permutation's own launch ended 2 us after the router), else in two.

    Returns
    -------
    weight, expert
        As ``route``.
    permutation : (offs, rowidx, pos, active)
        As ``permute`` (``routed_experts``' ``permutation``).
    """
    shape, kernel = _route_args(x, gate, k, scale, None, None)
    _check_n_local(n_local)
    if not router_permutes(x.shape[0]):
        weight, expert = _route(x, gate, k, scale, shape, kernel)
        return weight, expert, permute(expert, n_local)
    perm = _permutation(x.shape[0] * k, n_local, x.device)
    weight, expert = _route(x, gate, k, scale, shape, kernel, (n_local, *perm))
    return weight, expert, perm


def permute(expert: torch.Tensor, n_local: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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
    active : int32 [n_local]
        The local experts with tokens, ascending, then -1 (``grouped_gemm``'s routed grid rows).
    """
    from kdtree.kernels import launch, ptr

    if not isinstance(expert, torch.Tensor) or expert.dtype != torch.int64 or not expert.is_cuda:
        raise TypeError(f"expert: expected an int64 CUDA tensor, got {getattr(expert, 'dtype', type(expert))}")
    if expert.dim() != 2:
        raise ValueError(f"expert: expected [T, k], got shape {tuple(expert.shape)}")
    _check_n_local(n_local)
    expert = expert.contiguous()
    S, dev = expert.numel(), expert.device
    offs, rowidx, pos, active = _permutation(S, n_local, dev)
    fn = _kernel("moe_permute", _index(dev), ())
    launch(fn, (1,), (1024,), (ptr(expert), np.int32(S), np.int32(expert.shape[1]), np.int32(n_local),
                               ptr(offs), ptr(rowidx), ptr(pos), ptr(active)), device=dev, pdl=True)
    return offs, rowidx, pos, active


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, rows: int, *,
                 up: torch.Tensor | None = None, rowidx: torch.Tensor | None = None, nt: int = 1,
                 shape: tuple[int, int] | None = None, shared: torch.Tensor | None = None,
                 shared_up: torch.Tensor | None = None, shared_first: int = 0,
                 active: torch.Tensor | None = None, groups: int | None = None, rows_routed: int | None = None,
                 x_ready: bool = False) -> torch.Tensor:
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
    rowidx : int32 [>= shared_first with ``shared``, else >= rows], optional
    nt : int
        Token tiles of 8 per chunk (``chunk_tiles``).
    shape : (ksplit, stages), optional
        Warps splitting K and ring depth; default ``SHAPES[nt]``.
    shared : bf16 [Ns, Ks], optional
        An extra group (the shared expert) over positions ``shared_first .. rows - 1``: position
        p reads token ``p - shared_first`` of x through the gather (row p without ``rowidx``),
        its first Ks values (Ks <= K, a multiple of 64 * ksplit), and writes the first Ns
        columns of its output row (Ns <= N, a multiple of the row tile).
    shared_up : bf16 [Ns, Ks]
        The extra group's up projection; required with ``up`` and ``shared``.
    shared_first : int
        The extra group's first position (the routed groups end at or before it).
    active : int32 [E], optional
        ``permute``'s experts with tokens (ascending, then -1): the routed blocks take its first
        ``groups`` entries (``rows_routed``), not one grid row per expert. Without it, row e is
        expert e.
    groups : int, optional
        Entries of ``active`` the routed blocks may take, 1 .. E (default E): at least the
        number of experts with tokens (``min(E, T k)`` always is).
    rows_routed : int, optional
        Grid rows for the routed experts, 1 .. groups (default groups): row j takes the entries
        j, j + rows_routed, ... of ``active`` up to the first -1, so fewer rows than experts with
        tokens mean more work per block, more mean empty blocks. Needs ``active`` below groups.
    x_ready : bool
        x was complete before the kernel launched just before this one (the layer's gate/up
        GEMM after ``permute``): the extra group's blocks stream x and their weights while that
        kernel still runs (programmatic dependent launch) and wait for it only before they
        store. False: every block waits first.

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
    n_sh = k_sh = n_tok = 0
    if shared is not None:
        _check_bf16("shared", shared, 2)
        n_sh, k_sh = shared.shape
        if (up is None) != (shared_up is None):
            raise ValueError("shared_up: expected exactly when both up and shared are given")
        if shared_up is not None:
            _check_bf16("shared_up", shared_up, 2)
            if shared_up.shape != shared.shape:
                raise ValueError(f"shared_up: expected the shape of shared {tuple(shared.shape)}, got "
                                 f"{tuple(shared_up.shape)}")
        if k_sh > K or k_sh % (64 * ksplit) or n_sh > N or n_sh % tile:
            raise ValueError(f"shared: expected [Ns, Ks] with Ks <= {K}, Ks % {64 * ksplit} == 0, Ns <= {N} and "
                             f"Ns % {tile} == 0, got {tuple(shared.shape)}")
        if not isinstance(shared_first, int) or not 0 <= shared_first <= rows:
            raise ValueError(f"shared_first: expected an int in 0..{rows}, got {shared_first!r}")
        n_tok = rows - shared_first
    elif shared_up is not None:
        raise ValueError("shared_up: given without shared")
    routed = shared_first if shared is not None else rows
    if rowidx is not None and (rowidx.dtype != torch.int32 or rowidx.dim() != 1 or rowidx.shape[0] < routed):
        raise ValueError(f"rowidx: expected int32 [>= {routed}], got {rowidx.dtype} {tuple(rowidx.shape)}")
    groups = E if groups is None else groups
    if not isinstance(groups, int) or isinstance(groups, bool) or not 1 <= groups <= E:
        raise ValueError(f"groups: expected an int in 1..{E}, got {groups!r}")
    if active is not None and (not isinstance(active, torch.Tensor) or active.dtype != torch.int32
                               or active.shape != (E,) or active.device != w.device):
        raise ValueError(f"active: expected int32 [{E}] on {w.device}")
    if active is None and groups != E:
        raise ValueError(f"groups: expected {E} (one grid row per expert) without active, got {groups}")
    rows_routed = groups if rows_routed is None else rows_routed
    if not isinstance(rows_routed, int) or isinstance(rows_routed, bool) or not 1 <= rows_routed <= groups:
        raise ValueError(f"rows_routed: expected an int in 1..{groups} (groups), got {rows_routed!r}")
    if active is None and rows_routed != groups:
        raise ValueError(f"rows_routed: expected {groups} (groups) without active, got {rows_routed}")
    if x.device != w.device or (shared is not None and shared.device != w.device):
        raise ValueError(f"x, shared: expected the device of w ({w.device}), got {x.device}")
    out = torch.empty(rows, N, device=x.device, dtype=torch.bfloat16 if up is not None else torch.float32)
    if rows == 0:
        return out
    defines = (("MOE_GATED", int(up is not None)), ("MOE_K", K), ("MOE_KSPLIT", ksplit), ("MOE_NT", nt),
               ("MOE_STAGES", stages))
    fn = _kernel("moe_grouped_gemm", _index(x.device), defines)
    chunks = -(-n_tok // (8 * nt))
    s0 = shared if shared is not None else w
    launch(fn, (N // tile, chunks + rows_routed), (32 * ksplit,),
           (ptr(x), np.uint64(0) if rowidx is None else ptr(rowidx), ptr(w), ptr(w if up is None else up), ptr(offs),
            np.uint64(0) if active is None else ptr(active), ptr(out), np.int32(N), ptr(s0),
            ptr(s0 if shared_up is None else shared_up), np.int32(n_sh), np.int32(k_sh), np.int32(shared_first),
            np.int32(n_tok), np.int32(bool(x_ready)), np.int32(groups)),
           shared_mem=smem_bytes(nt, ksplit, stages), device=x.device, pdl=True)
    return out


def combine(ys: torch.Tensor, pos: torch.Tensor, weight: torch.Tensor, shared_first: int | None = None) -> torch.Tensor:
    """``out[t] = ys[shared_first + t] + sum_s weight[t, s] ys[pos[t, s]]`` over slots with ``pos >= 0``,
    float32 sums (without ``shared_first``, no shared row).

    ``ys`` float32 [P, dim] (dim % 4 == 0), ``pos`` int32 [T k], ``weight`` float32 [T, k]
    (k <= 8), ``shared_first`` with ``shared_first + T <= P``. Returns bf16 [T, dim].
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
    if shared_first is not None and (not isinstance(shared_first, int) or not 0 <= shared_first <= ys.shape[0] - T):
        raise ValueError(f"shared_first: expected an int in 0..{ys.shape[0] - T}, got {shared_first!r}")
    out = torch.empty(T, D, device=ys.device, dtype=torch.bfloat16)
    if T == 0:
        return out
    fn = _kernel("moe_combine", _index(ys.device), (("MOE_TOPK", k),))
    launch(fn, (T, -(-D // 1024)), (256,), (ptr(ys), ptr(pos.contiguous()), ptr(weight.contiguous()),
                              np.int32(-1 if shared_first is None else shared_first), ptr(out), np.int32(D)),
           device=ys.device, pdl=True)
    return out


def routed_experts(x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                   w2: torch.Tensor, shared: tuple | None = None, experts_total: int | None = None,
                   x_ready: bool = False, permutation: tuple | None = None) -> torch.Tensor:
    """The weighted sum [T, dim] of each token's local experts (``MoE.experts``), plus the shared expert.

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
    shared : (w1, w3, w2), optional
        The shared expert's gate and up [inter_s, dim] and down [dim, inter_s] (bf16, inter_s a
        multiple of 256, at most inter): computed for every token inside the same two GEMM
        launches and added with weight 1.
    experts_total : int, optional
        Global experts the router chooses from (sizes the token chunks); default E.
    x_ready : bool
        x was complete before the kernel launched just before this call ran (in the layer,
        the router's: x comes before it): the shared expert's gate/up blocks then stream x and
        their weights while that kernel still runs (``grouped_gemm``'s ``x_ready``). False when
        the kernel just before may still be writing x.
    permutation : (offs, rowidx, pos, active), optional
        ``permute(expert, E)``'s result, already computed (``route_permuted``); default: this call
        launches ``permute``.
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
    s1 = s3 = s2 = None
    if shared is not None:
        if not isinstance(shared, (tuple, list)) or len(shared) != 3:
            raise TypeError("shared: expected a tuple (w1, w3, w2) of the shared expert's weights")
        s1, s3, s2 = shared
        for name, w in (("shared w1", s1), ("shared w3", s3), ("shared w2", s2)):
            _check_bf16(name, w, 2)
        hs = s1.shape[0]
        if s1.shape != (hs, d) or s3.shape != (hs, d) or s2.shape != (d, hs):
            raise ValueError(f"shared: expected w1, w3 [inter_s, {d}] and w2 [{d}, inter_s], got {tuple(s1.shape)}, "
                             f"{tuple(s3.shape)}, {tuple(s2.shape)}")
    T, k = expert.shape
    rows = T * k + (T if shared is not None else 0)
    offs, rowidx, pos, active = permute(expert, E) if permutation is None else permutation
    gate_up, down = layer_gemm_options(T, k, experts_total or E, E, d)
    hid = grouped_gemm(x, w1, offs, rows, up=w3, rowidx=rowidx, shared=s1, shared_up=s3, active=active,
                       x_ready=x_ready, **gate_up)
    ys = grouped_gemm(hid, w2, offs, rows, shared=s2, active=active, **down)
    return combine(ys, pos, weight.float(), T * k if shared is not None else None)


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


def reference_route(x: torch.Tensor, gate: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` in float64 on the host: scores ``sigmoid(x gate^T)``, each token's top ``k`` by
    score descending and expert id ascending among equal scores, renormalised and scaled.
    Returns (weight float64 [T, k], expert int64 [T, k])."""
    scores = torch.sigmoid(x.double().cpu() @ gate.double().cpu().T)
    order = scores.sort(dim=-1, descending=True, stable=True).indices[:, :k]   # stable: equal scores keep id order
    top = scores.gather(1, order)
    return top / top.sum(-1, keepdim=True) * scale, order

