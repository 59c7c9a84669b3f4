"""Tree-verify MLA-absorb attention: the reference, the CUDA variants, and dispatch.

Query row (n, h) of sequence b attends to the whole prefix ``kv[b, :P_b]`` and to the tree rows
``kv[b, P_b + j]`` of the nodes j its visibility row marks (its ancestors and itself). Keys are the
576-wide latent rows shared by all heads; values are their first 512 entries.

Variants (all selectable by name, see ``verify_attention``):

* ``naive``: one CUDA block per (sequence, query, head), re-reading the latent rows per head.
* ``cascade``: the fused kernel over the prefix only (split across SMs), again over the tree rows
  only, then an lse merge: the two-pass scheme serving stacks use.
* ``fused``: one pass over each latent row per tile of (query, head) rows on bf16 tensor cores,
  the ancestor mask applied in the same pass, long prefixes split across SMs and merged. On
  sm_90 with nvcc it runs ``pair`` (``cuda/verify_attention_pair.cu``, sm_90a): 64 rows per block
  on the tile's M dimension, KV tiles in pairs, one warpgroup computing S and the softmax of each
  tile of a pair, both accumulating P V over their halves of the value columns (the own tile's P
  from registers, the other's through shared memory), so that one warpgroup's softmax overlaps
  the other's products; each 64-column box of a KV tile lands through the copy engine (TMA, a
  tensor map of kv encoded on the host: ``kdtree.tensor_map``) on its own mbarrier. The earlier
  TMA kernels (``cuda/verify_attention_tma.cu``: ``tma_seq``, alternate tiles fed by a producer
  warpgroup, and ``tma``), the first wgmma kernel (``impl="wgmma"``,
  ``cuda/verify_attention_wgmma.cu``) and a transposed one (KV tokens on M, the rows on N in 8-row
  groups: ``cuda/verify_attention_rows_n.cu``, ``layout="rows_n"``) run only when asked. Elsewhere
  the mma.sync kernel (``cuda/verify_attention.cu``, NVRTC). ``launch_plan`` says what runs, per
  shape.
* ``torch``: the reference in float32 (works on CPU and under CUDA graphs).
"""
from __future__ import annotations

import functools
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch

from kdtree.checks import check_tensor
from kdtree.tree import Tree, visibility_mask

D_QK = 576          # absorbed q / latent key width (512 latent + 64 rope)
D_V = 512           # value / output width per head
HEADS = (8, 16, 32, 64, 128)
MAX_NODES = 1025    # N = budget + 1
VARIANTS = ("naive", "cascade", "fused", "torch")
CUDA_VARIANTS = ("naive", "cascade", "fused")

_SRC = "verify_attention"
_SRC_WGMMA = "verify_attention_wgmma"
_SRC_ROWS_N = "verify_attention_rows_n"
_SRC_TMA = "verify_attention_tma"
_SRC_PAIR = "verify_attention_pair"
_SRC_RN72 = "verify_attention_rows_n72"
FUSED_IMPLS = ("mma", "wgmma", "tma", "tma_seq", "pair", "rn72")
_WGMMA_IMPLS = ("wgmma", "tma", "tma_seq", "pair", "rn72")  # sm_90a kernels, built by nvcc
_TMA_MAP_IMPLS = ("tma", "tma_seq", "pair")  # take the kv tensor map
# The fused kernel an sm_90 GPU runs unless told otherwise: on an H200, 1.10-1.16x faster than
# tma_seq (the default before) at every shape timed (docs/perf_log.md, verify attention v8) but
# the launches of many short splits that fill the GPU, where ``sm90_impl`` picks tma_seq.
SM90_IMPL = "pair"
# sm90_impl's rule: tma_seq for a launch of at least this many splits, blocks of at most this many
# KV tiles, and at least this fraction of a wave of blocks.
_SEQ_MIN_SPLITS, _SEQ_MAX_TILES, _SEQ_MIN_WAVE = 8, 13, 0.75
LAYOUTS = ("rows_m", "rows_n")
_FUSED_BM, _FUSED_BN = 64, 64      # FUSED_BM / FUSED_BN in cuda/attention_tile.cuh
_FUSED_THREADS = 256
_TILE_BYTES = (_FUSED_BM + 2 * _FUSED_BN) * D_QK * 2 + _FUSED_BM * _FUSED_BN * 2  # Q, two KV stages, P
# + 3 x BM floats of row statistics + 1024 B of base alignment (FUSED_SMEM_BYTES).
_FUSED_SMEM = _TILE_BYTES + 3 * _FUSED_BM * 4 + 1024
# rows_n (cuda/verify_attention_rows_n.cu): the same tiles + [2 warpgroups][4 warps][32 rows] floats
# (RN_SMEM_BYTES); a block holds at most 64 rows, in 8-row groups.
_RN_SMEM = _TILE_BYTES + 2 * 4 * 32 * 4 + 1024
_RN_MAX_ROWS = 64
# tma (cuda/verify_attention_tma.cu): the same with ten mbarriers (TMA_SMEM_BYTES), 384 threads
# (a producer warpgroup after the two consumer warpgroups).
_TMA_SMEM = _TILE_BYTES + 4 * _FUSED_BM * 4 + 10 * 8 + 1024
_TMA_THREADS = 384
# pair (cuda/verify_attention_pair.cu): the same tiles + sM, sScale0, sScale1, sRed [2] rows and 25
# mbarriers (PAIR_SMEM_BYTES), 256 threads (no producer warpgroup).
_PAIR_SMEM = _TILE_BYTES + 5 * _FUSED_BM * 4 + 25 * 8 + 1024
# rn72 (cuda/verify_attention_rows_n72.cu, RN72_SMEM_BYTES): Q of 72 rows, two stages of the 8
# value boxes, one rope box, P of 72 rows, alpha [2][72] floats, 8 mbarriers, 2 flags; no base slack.
_RN72_ROWS = 72
# A fused launch that names no kernel nor layout runs rn72 where its 72-row blocks compute at most
# _RN72_MAX_ROW_SHARE of the rows 64-row tiles would (H = 8, N = 9: 72 rows against 128; N = 17:
# 144 against 192; H = 8, N = 33 and H = 32, N = 9: 288 against 320) and the KV sequence has at
# least _RN72_MIN_KV_TILES tiles, in at most _RN72_MAX_SPLITS KV splits, or in more where the split
# launch fills at least _RN72_MIN_FILL of one wave of the SMs (one block an SM, no second wave): a
# block's fixed cost (its prologue while the launch's first tiles land, the first tile's max step,
# the end; traced in docs/perf_log.md, sessions 38 and 39) and rn72's extra splits (fewer row
# blocks than pair's to fill the SMs) must be paid for by enough KV and enough blocks. H100, rn72
# with its faster start (tile 1 issued once tile 0 has landed), scripts/rows_n72_ab.py (each
# shape's kernels alternating), rendered against this rule by `scripts/perf_tables.py rn72-rule`
# (docs/perf_log.md, session 40): rn72 faster than pair at every B = 8 and 64 shard shape from P =
# 4096 at row shares up to 0.9, and at B = 1 to 3 where the launch has 66 blocks or more, down to 3
# tiles a block; slower at P <= 2048 whatever the batch, and with 62 blocks or fewer (B = 1 and 2).
# It replaces pair only: where the rows_m rule runs tma_seq (many short splits), rn72 was as fast or
# slower (results/verify_attention_dev_h100/rn72_tma_seq_da7c365, session 41: B = 1 at P = 4096 and
# 16384, and B = 8, N = 9, H = 8, P = 4096).
_RN72_MAX_ROW_SHARE, _RN72_MAX_SPLITS, _RN72_MIN_FILL, _RN72_MIN_KV_TILES = 0.9, 2, 0.48, 64
_RN72_SMEM = _RN72_ROWS * D_QK * 2 + 2 * 8 * _FUSED_BN * 128 + _FUSED_BN * 128 + _RN72_ROWS * 128 + 2 * _RN72_ROWS * 4 + 8 * 8 + 2 * 4
_MAX_SPLITS = 32
# A fused launch of few row blocks (B = 1 shards: one to four 64-row tiles) may take up to
# _WIDE_MAX_SPLITS splits where they all run in one wave and every block keeps at least
# _WIDE_MIN_BLOCK_TILES KV tiles: at 32 splits those launches leave half the SMs or more idle. On an
# H100 (docs/perf_log.md, sessions 39 and 41), scripts/splits_wide.py had 48-64 splits faster at
# B = 1, N = 9, H = 8 from P = 16384, slower at P = 4096 (one or two tiles a block) and where a
# second wave of blocks formed; scripts/splits_ab.py timed this rule's counts faster than the capped
# ones at all 9 grid shapes it moves (`perf_tables.py splits-ab results/splits_ab_h100/76b8be8/
# splits_ab.csv`). Not for pair: at 43 splits of three row tiles it ran slower than at 29-31, where
# the other kernels gained (`perf_tables.py grid-diff` of results/verify_table_h100/da7c365 and
# b1_76b8be8, the B = 1 shard shapes).
_WIDE_MAX_SPLITS, _WIDE_MIN_BLOCK_TILES = 64, 4
# Bytes the GPU moves to and from HBM in one KV tile period of the fused kernel: ~4 TB/s x ~1.7 us
# on an H200 (docs/perf_log.md, session 16); choose_splits weighs the partials with it, past
# the first _PARTIAL_L2_BYTES of them (which stay in the L2: 0.4 of an H200's 60 MB).
_PARTIAL_BYTES_PER_TILE = 6.8e6
_PARTIAL_L2_BYTES = 24e6
# A split's partial output rows: O normalised by its own row sum, rounded to bf16 like the output
# itself (the combine's weights sum to 1, so the merged row's error stays within about one bf16
# rounding of each), and its lse in fp32 (log2).
PARTIAL_DTYPE = torch.bfloat16
# choose_splits weighs each split's partial row at the 2 KB of the fp32 rows its constants above
# were calibrated with, not at the 1 KB a bf16 row moves: weighed at 1 KB it picked more splits at
# 25 shapes of the verify grid, and timed against the old counts the new ones were slower at most
# of them (scripts/splits_ab.py; docs/perf_log.md, session 25). What a split costs beyond its
# bytes (its blocks' prologue, Q reload and epilogue) is in this weight.
_SPLIT_ROW_WEIGHT = D_V * 4 + 4
_LOG2E = 1.4426950408889634
# choose_tail's time units are KV tile periods: a block costs its tiles plus _BLOCK_TILES (its
# prologue and epilogue: the one-split points of an H100 grid fit 2.6 us + 1.75 us a tile,
# `perf_tables.py grid-waves`), a split block _PARTIAL_TILES more (its partial rows), a launch
# with partials _COMBINE_TILES more (the combine), and _COMBINE_GROWTH more per wave of partial
# row sets it merges (a row tile's partials of one split; num_sms a wave). A head/tail plan
# replaces the uniform split count only where it saves at least _TAIL_MIN_GAIN of that count's
# modelled time. The growth is 0 in use: fitted with the other three to every committed head/tail
# A/B, it fits them better than the three alone, but the plans it moves are not timed yet
# (`perf_tables.py tail-form`, `tail-moves`).
_BLOCK_TILES, _PARTIAL_TILES, _COMBINE_TILES, _COMBINE_GROWTH, _TAIL_MIN_GAIN = 1.5, 0.5, 2.0, 0.0, 0.1


def _check_aligned(name: str, t: torch.Tensor) -> None:
    """``t`` starts at a 16-byte aligned address. The kernels move q, kv and out in 16-byte
    vectors or through tensor maps (which need it); a fresh tensor always is, a view that starts
    mid-row (``buf[..., 1:]`` made contiguous by its shape) may not be. Checked for every variant,
    so that a call that passes on one device passes on all."""
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: expected a tensor starting at a 16-byte aligned address, got "
                         f"{t.data_ptr():#x} (a view at offset {t.storage_offset()}; pass a fresh tensor "
                         f"or .clone())")


def _validate(q, kv, prefix_lens, tree, scale, variant, check_values, out):
    """Raise TypeError/ValueError naming the bad argument; nothing has run yet."""
    check_tensor("q", q, (torch.bfloat16,), 4)
    B, N, H, D = q.shape
    dev = q.device
    if D != D_QK:
        raise ValueError(f"q: expected last dimension {D_QK} (absorbed MLA), got {D}")
    if H not in HEADS:
        raise ValueError(f"q: unsupported number of heads H={H}; supported: {HEADS}")
    if not 1 <= N <= MAX_NODES:
        raise ValueError(f"q: tree nodes N={N} out of range 1..{MAX_NODES}")
    if B < 1:
        raise ValueError("q: empty batch")
    _check_aligned("q", q)
    check_tensor("kv", kv, (torch.bfloat16,), 3, dev)
    _check_aligned("kv", kv)
    if kv.shape[0] != B or kv.shape[2] != D_QK:
        raise ValueError(f"kv: expected shape [{B}, S, {D_QK}], got {tuple(kv.shape)}")
    S = kv.shape[1]
    if S < N:
        raise ValueError(f"kv: S={S} rows cannot hold the N={N} tree rows")
    check_tensor("prefix_lens", prefix_lens, (torch.int32, torch.int64), 1, dev)
    if prefix_lens.shape[0] != B:
        raise ValueError(f"prefix_lens: expected shape [{B}], got {tuple(prefix_lens.shape)}")
    if not isinstance(tree, Tree):
        raise TypeError(f"tree: expected kdtree.Tree, got {type(tree).__name__}")
    W = (N + 63) // 64
    check_tensor("tree.visibility", tree.visibility, (torch.int64,), 3, dev)
    if tuple(tree.visibility.shape) != (B, N, W):
        raise ValueError(f"tree.visibility: expected shape [{B}, {N}, {W}] to match q, "
                         f"got {tuple(tree.visibility.shape)}")
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"scale: expected a real number, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: expected a finite positive number, got {scale}")
    if variant not in VARIANTS + ("auto",):
        raise ValueError(f"variant: expected one of {VARIANTS + ('auto',)}, got {variant!r}")
    if variant in CUDA_VARIANTS and dev.type != "cuda":
        raise ValueError(f"variant: {variant!r} needs CUDA tensors, q is on {dev}")
    if out is not None:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("out: expected a tuple (out, lse)")
        check_tensor("out[0]", out[0], (torch.bfloat16,), 4, dev)
        check_tensor("out[1]", out[1], (torch.float32,), 3, dev)
        if tuple(out[0].shape) != (B, N, H, D_V) or tuple(out[1].shape) != (B, N, H):
            raise ValueError(f"out: expected shapes [{B}, {N}, {H}, {D_V}] and [{B}, {N}, {H}]")
        _check_aligned("out[0]", out[0])
    capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if check_values and not capturing:
        lo, hi = int(prefix_lens.min()), int(prefix_lens.max())
        if lo < 0:
            raise ValueError(f"prefix_lens: negative prefix length {lo}")
        if hi + N > S:
            raise ValueError(f"prefix_lens: prefix {hi} + N={N} tree rows exceeds kv's S={S}")


def reference_attention(q, kv, prefix_lens, tree, scale, dtype=torch.float64):
    """Masked softmax attention computed in ``dtype`` from the (upcast) inputs.

    Returns ``(out [B, N, H, 512], lse [B, N, H])`` both in ``dtype``; a row that sees no key
    gets ``out = 0`` and ``lse = -inf``. No host synchronisation (graph-capturable on CUDA).
    """
    B, N, H, _ = q.shape
    S = kv.shape[1]
    mask = visibility_mask(tree.visibility, prefix_lens, S)                 # [B, N, S]
    outs, lses = [], []
    for b in range(B):  # one sequence at a time bounds the [N*H, S] score matrix
        k = kv[b].to(dtype)
        s = (q[b].reshape(N * H, D_QK).to(dtype) @ k.T) * scale
        s = s.view(N, H, S).masked_fill(~mask[b][:, None, :], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                  # [N, H]
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        outs.append((p.reshape(N * H, S) @ k[:, :D_V]).view(N, H, D_V))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _torch_variant(q, kv, prefix_lens, tree, scale):
    out, lse = reference_attention(q, kv, prefix_lens, tree, scale, dtype=torch.float32)
    return out.to(torch.bfloat16), lse


@functools.lru_cache(maxsize=None)
def _kernel(name: str, index: int, src: str = _SRC, compiler: str = "nvrtc"):
    """The compiled kernel, looked up once per process and device (keeps eager launches cheap)."""
    from kdtree.kernels import get_kernel

    return get_kernel(src, name, device=index, compiler=compiler)


@functools.lru_cache(maxsize=None)
def fused_impl(index: int) -> str:
    """The fused kernel a device runs: ``SM90_IMPL`` (``pair``) on sm_90 when nvcc is there,
    else ``mma``.

    ``pair`` (``cuda/verify_attention_pair.cu``, sm_90a, built by nvcc): KV tiles in pairs, the
    two warpgroups trading the softmax of one tile against the products of the other; on an H200
    it was faster than ``tma_seq`` (the default before) at every shape timed (docs/perf_log.md)
    but launches of many short splits, where ``launch_plan`` runs ``tma_seq`` instead
    (``sm90_impl``, ``default_impl``). The environment variable ``KDTREE_FUSED_IMPL`` (one of
    ``FUSED_IMPLS`` but ``rn72``, which runs only fused calls) overrides the choice at every shape:
    ``tma_seq``, ``tma`` (``cuda/verify_attention_tma.cu``) and ``wgmma``
    (``cuda/verify_attention_wgmma.cu``), all sm_90a, run only when asked.
    """
    import shutil

    forced = os.environ.get("KDTREE_FUSED_IMPL")
    if forced is not None and forced not in FUSED_IMPLS:
        raise ValueError(f"KDTREE_FUSED_IMPL: expected one of {FUSED_IMPLS}, got {forced!r}")
    if forced == "rn72":  # it cannot be every shape's kernel: cascade's passes are rows_m
        raise ValueError("KDTREE_FUSED_IMPL=rn72: rn72 runs fused calls in the rows_n layout only (cascade "
                         "cannot run it); fused calls pick it where it was timed faster")
    have_nvcc = shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")
    sm90 = torch.cuda.get_device_capability(index) == (9, 0)
    if forced is None:
        return SM90_IMPL if sm90 and have_nvcc else "mma"
    if forced in _WGMMA_IMPLS and not (sm90 and have_nvcc):
        raise ValueError(f"KDTREE_FUSED_IMPL={forced}: needs an sm_90 GPU and nvcc (for sm_90a)")
    return forced


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def choose_splits(blocks: int, kv_rows: int, num_sms: int, rows: int = 0, wide: bool = False) -> int:
    """KV splits for the fused kernel: the fewest estimated tile periods.

    ``blocks`` are the (row tile, sequence) blocks, one resident per SM (the kernel takes ~225 KB
    of shared memory). A split count s costs its waves x tiles per block, plus, when s > 1, two
    tiles a block (prologue and partial write) and the HBM traffic of the partials of the
    ``rows`` (batch x nodes x heads) query rows: each split writes a row that the combine reads
    back, weighed at ``_SPLIT_ROW_WEIGHT`` bytes; what does not stay in the L2 costs
    ``_PARTIAL_BYTES_PER_TILE`` bytes per tile period. Without that term, 64 sequences of 264
    rows at P = 32768 took 7 splits where ``cascade`` with 2 ran 4% faster; with it, the counts
    it moves were timed against the old ones (``scripts/splits_ab.py``; docs/perf_log.md,
    session 18). With ``wide`` (fused launches), past ``_MAX_SPLITS`` up to ``_WIDE_MAX_SPLITS``
    where the blocks stay one wave and keep ``_WIDE_MIN_BLOCK_TILES`` tiles each.
    """
    tiles = max(1, -(-kv_rows // _FUSED_BN))
    cap = max(_MAX_SPLITS, min(_WIDE_MAX_SPLITS, num_sms // blocks, tiles // _WIDE_MIN_BLOCK_TILES) if wide else 0)
    best, best_cost = 1, None
    for s in range(1, min(cap, tiles) + 1):
        cost = -(-blocks * s // num_sms) * (-(-tiles // s) + (2 if s > 1 else 0))
        if s > 1:  # the partials past what stays in the L2 go to HBM and back
            cost += 2 * max(0.0, s * rows * _SPLIT_ROW_WEIGHT - _PARTIAL_L2_BYTES) / _PARTIAL_BYTES_PER_TILE
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def _makespan(head_blocks: int, head_cost: float, tail_blocks: int, tail_cost: float, num_sms: int) -> float:
    """When the last block of a launch ends, blocks handed out in index order to the SM that frees
    first (one resident per SM): ``head_blocks`` of ``head_cost`` then ``tail_blocks`` of
    ``tail_cost``. Equal blocks on identical SMs: the earliest-free rule is optimal, so the end is
    the first time by which the SMs, free from the head's last wave on, fit every tail block."""
    waves, r = divmod(head_blocks, num_sms)
    a, b = waves * head_cost, (waves + 1) * head_cost   # num_sms - r SMs free at a, r at b
    end = b if r else a
    if tail_blocks == 0:
        return end

    def fits(t: float) -> bool:
        return (num_sms - r) * math.floor((t - a) / tail_cost + 1e-9) + r * max(
            0, math.floor((t - b) / tail_cost + 1e-9)) >= tail_blocks

    best = math.inf
    for start in (a, b) if r else (a,):
        lo, hi = 1, -(-tail_blocks // (num_sms - r)) + 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(start + mid * tail_cost) else (mid + 1, hi)
        if fits(start + lo * tail_cost):
            best = min(best, start + lo * tail_cost)
    return max(end, best)


def choose_tail(row_tiles: int, kv_rows: int, num_sms: int, splits: int, fewer: bool = True) -> tuple[int, int, int]:
    """A head/tail schedule for a fused launch of ``row_tiles`` (row tile, sequence) blocks whose
    uniform split count is ``splits``: ``(head_splits, head, tail_splits)``, or ``(splits, 0, 0)``
    to keep the uniform launch.

    One split count for every row tile leaves the launch's last wave part empty: 144 row tiles of
    17 KV tiles on 132 SMs (B = 16, N = 9, H = 64, P = 1024) run as two waves of 17 tiles. A
    head/tail launch (``fused_block_ht``) runs the first ``head`` row tiles in ``head_splits``
    splits, all its waves but the last whole, and the rest, the tail, in ``tail_splits`` short
    blocks that the SMs take as they free: 132 whole row tiles, then 12 row tiles in 9 splits of 2
    tiles, one short block an SM. The head may take fewer splits than the uniform launch: each
    count from ``splits`` down to 1 is tried with the head that leaves one wave to the tail. 72 row
    tiles of 65 KV tiles (B = 8, N = 65, H = 8, P = 4096) run uniform in 3 splits as 216 blocks of
    22 tiles, a wave and two thirds; the plan runs a head of 66 row tiles in 2 splits, one wave of
    blocks of 33 tiles, and the other 6 row tiles follow in 22 splits of 3 tiles.
    Modelled in KV tile periods (``_makespan``, ``_BLOCK_TILES``...); a tail plan replaces the
    uniform one only where it saves at least ``_TAIL_MIN_GAIN`` of its time.

    Parameters
    ----------
    row_tiles : int
        Row tiles of the launch, all sequences (B x ceil(N H / 64)).
    kv_rows : int
        KV rows a block walks (the cache length).
    num_sms : int
        Streaming multiprocessors (one block resident on each).
    splits : int
        The uniform launch's split count (``choose_splits``): the most the head takes.
    fewer : bool
        Try heads of fewer splits than ``splits`` (the default). Timed on an H100 at every shape of
        the verify grid where it moves the plan, faster than the plan with the head at ``splits``
        at each (``results/splits_ab_h100/fewer_26998f2``). False gives that older plan, the one
        earlier runs had (``scripts/perf_tables.py`` reads their logs with it).

    Returns
    -------
    tuple of int
        ``(head_splits, head, tail_splits)``; ``(splits, 0, 0)``: no tail.
    """
    tiles = max(1, -(-kv_rows // _FUSED_BN))
    if row_tiles * splits % num_sms == 0 or splits >= tiles:
        return splits, 0, 0
    best, plan = launch_tiles(row_tiles, kv_rows, num_sms, splits) * (1.0 - _TAIL_MIN_GAIN), (splits, 0, 0)
    for s in range(splits, 0 if fewer else splits - 1, -1):   # on a tie, the most head splits (fewest partials)
        head = (-(-row_tiles * s // num_sms) - 1) * num_sms // s   # the head's blocks fill whole waves
        if not 0 < head < row_tiles:
            continue
        for ts in range(s + 1, min(_MAX_SPLITS, tiles) + 1):
            t = launch_tiles(row_tiles, kv_rows, num_sms, s, head, ts)
            if t < best:
                best, plan = t, (s, head, ts)
    return plan


def launch_tiles(row_tiles: int, kv_rows: int, num_sms: int, splits: int, head: int = 0,
                 tail_splits: int = 0, costs: tuple[float, ...] | None = None) -> float:
    """``choose_tail``'s model of a fused launch (and its combine), in KV tile periods: uniform in
    ``splits`` where ``head`` is 0, else head/tail. Each block costs its tiles plus
    ``_BLOCK_TILES`` (``_PARTIAL_TILES`` more if it writes partials); the SMs take the blocks in
    order (``_makespan``); partials add ``_COMBINE_TILES`` and ``_COMBINE_GROWTH`` per wave of
    partial row sets. ``costs``: the first three, or all four, instead (a fit of them,
    ``perf_tables.py tail-fit``, ``tail-form``)."""
    block_cost, partial_cost, combine_cost, growth = (*(costs or (_BLOCK_TILES, _PARTIAL_TILES, _COMBINE_TILES)),
                                                      _COMBINE_GROWTH)[:4]
    tiles = max(1, -(-kv_rows // _FUSED_BN))

    def block(s: int) -> float:
        return -(-tiles // s) + block_cost + (partial_cost if s > 1 else 0.0)

    n_head = (head if head else row_tiles) * splits
    n_tail = (row_tiles - head) * tail_splits if head else 0
    span = _makespan(n_head, block(splits), n_tail, block(tail_splits) if n_tail else 0.0, num_sms)
    partial_sets = (n_head if splits > 1 else 0) + n_tail
    return span + (combine_cost + growth * partial_sets / num_sms if partial_sets else 0.0)


def sm90_impl(splits: int, block_tiles: int, blocks: int, num_sms: int) -> str:
    """The sm_90a kernel of a ``fused`` launch that names none: ``tma_seq`` for a launch of at
    least 8 splits whose blocks walk at most 13 KV tiles and fill at least three quarters of a
    wave (one block per SM), else ``SM90_IMPL`` (``pair``).

    ``pair`` hides one tile's softmax under the other's products, a gain that grows with the tiles
    a block walks; the rule is read off measurements, not derived. In an H200 grid of 192 shapes
    ``pair`` was slower than ``tma_seq`` at all 11 launches this rule names (1.06-1.11x, 10 of them
    at B = 1) and at 3 others, by at most 4% (docs/perf_log.md, session 21).

    Parameters
    ----------
    splits : int
        KV splits of the launch.
    block_tiles : int
        KV tiles of its longest block.
    blocks : int
        Blocks of the launch (row tiles x sequences x splits).
    num_sms : int
        Streaming multiprocessors (one block resident on each).

    Returns
    -------
    str
        ``"tma_seq"`` or ``SM90_IMPL``.
    """
    if splits >= _SEQ_MIN_SPLITS and block_tiles <= _SEQ_MAX_TILES and blocks >= _SEQ_MIN_WAVE * num_sms:
        return "tma_seq"
    return SM90_IMPL


def default_impl(index: int) -> str | None:
    """The ``impl`` a call that names none gives ``launch_plan`` on device ``index``: None (the
    sm_90a kernel chosen per launch, ``sm90_impl``) where ``fused_impl`` runs ``SM90_IMPL`` without
    ``KDTREE_FUSED_IMPL`` forcing it, else ``fused_impl``'s kernel at every shape."""
    impl = fused_impl(index)
    return None if impl == SM90_IMPL and "KDTREE_FUSED_IMPL" not in os.environ else impl


def rows_n_tile(rows: int) -> int:
    """Rows per block of the ``rows_n`` layout for a sequence of ``rows`` (node x head) rows.

    The fewest blocks of at most 64 rows, evened out and rounded up to a multiple of 8.
    """
    tiles = -(-rows // _RN_MAX_ROWS)
    per_tile = -(-rows // tiles)
    return 8 * -(-per_tile // 8)


def _rows_n_kernel(tile_rows: int) -> str:
    """The rows_n kernel entry for a tile: ``verify_fused_rows_n<NW>``, NW = warpgroup 0's rows."""
    groups = tile_rows // 8
    return f"verify_fused_rows_n{8 * -(-groups // 2)}"


def _launch_fused(impl, layout, tile_rows, q, kv, pl, vis, out, lse, o_part, lse_part, splits, slot0, mode,
                  scale_log2, head=0, tail_splits=0):
    from kdtree.kernels import launch, ptr

    B, N, H, _ = q.shape
    null = np.uint64(0)
    args = (ptr(q), ptr(kv), ptr(pl), ptr(vis), ptr(out), ptr(lse),
            ptr(o_part) if o_part is not None else null, ptr(lse_part) if lse_part is not None else null,
            np.int32(B), np.int32(kv.shape[1]), np.int32(N), np.int32(H), np.int32(vis.shape[2]),
            np.int32(splits), np.int32(slot0), np.int32(mode))
    grid = (-(-(N * H) // tile_rows), splits, B)
    if impl == "rn72":
        from kdtree.tensor_map import bf16_matrix_map

        fn = _kernel("verify_fused_rn72", _index(q.device), _SRC_RN72, "nvcc")
        args += (np.float32(scale_log2), bf16_matrix_map(kv.data_ptr(), B * kv.shape[1], D_QK, 2 * D_QK, _FUSED_BN, 64))
        launch(fn, grid, (_FUSED_THREADS,), args, shared_mem=_RN72_SMEM, device=q.device)
        return
    if layout == "rows_n":
        fn = _kernel(_rows_n_kernel(tile_rows), _index(q.device), _SRC_ROWS_N, "nvcc")
        launch(fn, grid, (_FUSED_THREADS,), args + (np.int32(tile_rows), np.float32(scale_log2)),
               shared_mem=_RN_SMEM, device=q.device)
        return
    if impl in _TMA_MAP_IMPLS:
        from kdtree.tensor_map import bf16_matrix_map

        pair = impl == "pair"
        fn = _kernel(f"verify_fused_{impl}", _index(q.device), _SRC_PAIR if pair else _SRC_TMA, "nvcc")
        if pair:  # a head/tail launch runs on a 1-D grid (fused_block_ht)
            args += (np.int32(head), np.int32(tail_splits))
            if head:
                grid = (head * splits + (grid[0] * B - head) * tail_splits, 1, 1)
        args += (np.float32(scale_log2), bf16_matrix_map(kv.data_ptr(), B * kv.shape[1], D_QK, 2 * D_QK,
                                                          _FUSED_BN, 64))
        if pair:  # pair also loads Q with the copy engine (q's [B N H, 576] rows, the same boxes) and stores O
            # with it: out as B matrices of [N H, 512], o_part as slots x B (boxes past N H rows unwritten)
            args += (bf16_matrix_map(q.data_ptr(), B * N * H, D_QK, 2 * D_QK, _FUSED_BM, 64),)
            omap = bf16_matrix_map(out.data_ptr(), N * H, D_V, 2 * D_V, _FUSED_BM, 64, depth=B,
                                   depth_stride_bytes=2 * D_V * N * H)
            pmap = omap if o_part is None else bf16_matrix_map(
                o_part.data_ptr(), N * H, D_V, 2 * D_V, _FUSED_BM, 64, depth=o_part.shape[0] * B,
                depth_stride_bytes=2 * D_V * N * H)
            args += (omap, pmap)
        launch(fn, grid, (_FUSED_THREADS if pair else _TMA_THREADS,), args,
               shared_mem=_PAIR_SMEM if pair else _TMA_SMEM, device=q.device)
        return
    if impl == "wgmma":
        fn = _kernel("verify_fused_wgmma", _index(q.device), _SRC_WGMMA, "nvcc")
    else:
        fn = _kernel("verify_fused", _index(q.device))
    launch(fn, grid, (_FUSED_THREADS,), args + (np.float32(scale_log2),), shared_mem=_FUSED_SMEM, device=q.device)


def _launch_combine(o_part, lse_part, out, lse, slots=None, row0=0, tail_row=None, tail_slots=0):
    """Merge ``slots`` partials (default: all of ``o_part``'s) into every row from flat row
    ``row0`` on (rows numbered sequence-major), ``tail_slots`` from ``tail_row`` on."""
    from kdtree.kernels import launch, ptr

    n_slots, B, NH, _ = o_part.shape
    tail_row = B * NH if tail_row is None else tail_row
    fn = _kernel("verify_combine", _index(out.device))
    grid = (NH, B) if row0 == 0 else (B * NH - row0, 1)
    launch(fn, grid, (D_V // 4,), (ptr(o_part), ptr(lse_part), ptr(out), ptr(lse), np.int32(B), np.int32(NH),
                                   np.int32(slots or n_slots), np.int32(row0), np.int32(tail_row),
                                   np.int32(tail_slots)), device=out.device, pdl=True)


@dataclass(frozen=True)
class LaunchPlan:
    """How one CUDA verify-attention call runs: what the cost model and every results row record.

    Attributes
    ----------
    variant : str
        ``naive``, ``cascade`` or ``fused``.
    impl : str
        The fused kernel (one of ``FUSED_IMPLS``); ``naive`` for the naive kernel.
    layout : str
        ``rows_m``: (tree row x head) rows on the tensor tile's M dimension, 64 per block;
        ``rows_n`` (wgmma, forced only): KV tokens on M and the rows on N, up to 64 per block in
        8-row groups (``cuda/verify_attention_rows_n.cu``).
    tile_rows : int
        Rows computed per block (per tile), padding included; a sequence's ``nodes x heads`` rows
        take ``ceil(nodes x heads / tile_rows)`` blocks, each reading the KV once.
    splits : int
        KV splits of the (prefix) pass; above 1 each split writes partials (``PARTIAL_DTYPE``)
        that a combine reads.
    partial_slots : int
        Partial sets written (``splits`` when split, plus one for cascade's tree pass; 0 if none).
    launches : int
        Kernel launches per call.
    head : int
        0, or a head/tail launch (``choose_tail``, the pair kernel): its first ``head`` row tiles
        (all sequences' row tiles numbered sequence-major) run in ``splits`` splits, the rest in
        ``tail_splits``.
    tail_splits : int
        KV splits of the tail's row tiles (0 without a tail).
    """

    variant: str
    impl: str
    layout: str
    tile_rows: int
    splits: int
    partial_slots: int
    launches: int
    head: int = 0
    tail_splits: int = 0


# A pure function of its arguments, asked once per call: cached, since choose_tail's search (every
# head split count, every tail count, a makespan each) is host work a shape needs only once.
@functools.lru_cache(maxsize=4096)
def launch_plan(variant: str, *, batch: int, nodes: int, heads: int, kv_rows: int, num_sms: int,
                impl: str | None = None, splits: int | None = None, layout: str | None = None) -> LaunchPlan:
    """The launch plan of a CUDA verify-attention call, computed on the host without a GPU.

    Parameters
    ----------
    variant : str
        ``naive``, ``cascade`` or ``fused``.
    batch, nodes, heads : int
        B, N (tree nodes) and H (heads on this GPU).
    kv_rows : int
        S, the cache length the kernel walks (``kv.shape[1]``).
    num_sms : int
        Streaming multiprocessors of the device (132 on an H200).
    impl : str, optional
        The fused kernel, one of ``FUSED_IMPLS`` (see ``fused_impl``): ``pair`` / ``tma_seq`` /
        ``tma`` (rows_m only), ``rn72`` (rows_n only), ``wgmma`` or ``mma``. Default: ``wgmma``
        for the rows_n layout; else, for ``fused``, ``rn72`` where its 72-row blocks compute at
        most ``_RN72_MAX_ROW_SHARE`` of the rows 64-row tiles would over at least
        ``_RN72_MIN_KV_TILES`` KV tiles, in at most ``_RN72_MAX_SPLITS`` splits or in more that fill
        at least ``_RN72_MIN_FILL`` of one wave (and no layout is forced), else the kernel
        ``sm90_impl`` picks for the launch (``pair`` or ``tma_seq``); ``SM90_IMPL`` for
        ``cascade``.
    splits : int, optional
        Force the KV split count (default: ``choose_splits``).
    layout : str, optional
        Force ``rows_m`` or ``rows_n`` (``fused`` on wgmma or rn72 only). The default is
        ``rows_m`` but where ``rn72`` is picked (above): on an H200 v4's rows_n kernel (``wgmma``,
        at most 64 rows a block) costs about 1.4x rows_m's time per KV tile at every row count it
        supports, and it needs as many blocks, so it lost at every measured shape, the padded
        H = 8, N = 9 one included (docs/perf_log.md, verify_attention v4).

    Returns
    -------
    LaunchPlan
    """
    if variant == "naive":
        return LaunchPlan("naive", "naive", "per_head", 1, 1, 0, 1)
    if variant not in ("fused", "cascade"):
        raise ValueError(f"variant: expected naive, cascade or fused, got {variant!r}")
    by_launch = impl is None and layout != "rows_n" and variant == "fused"
    if impl is None:
        impl = "wgmma" if layout == "rows_n" else SM90_IMPL
    if impl not in FUSED_IMPLS:
        raise ValueError(f"impl: expected one of {FUSED_IMPLS}, got {impl!r}")
    if layout not in (None,) + LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if impl == "rn72":
        if layout == "rows_m" or variant != "fused":
            raise ValueError("impl: 'rn72' runs only the fused variant, in the rows_n layout")
        layout = "rows_n"
    if layout == "rows_n" and (impl not in ("wgmma", "rn72") or variant != "fused"):
        raise ValueError("layout: 'rows_n' runs only the fused variant on the wgmma or rn72 kernel")
    rows = nodes * heads
    tile = (_RN72_ROWS if impl == "rn72" else rows_n_tile(rows)) if layout == "rows_n" else _FUSED_BM
    layout_forced, layout = layout, layout or "rows_m"
    blocks = -(-rows // tile) * batch
    kv = kv_rows if variant == "fused" else kv_rows - nodes
    # A fused launch first tries the wide split counts (choose_splits' wide); where it runs pair, named
    # or picked at that count, it takes the capped count instead: pair ran slower at the wide counts.
    for wide in (by_launch or (variant == "fused" and impl != "pair"), False):
        s = splits or choose_splits(blocks, kv, num_sms, batch * rows, wide=wide)
        if by_launch:
            impl = sm90_impl(s, -(-max(1, -(-kv // _FUSED_BN)) // s), blocks * s, num_sms)
        if impl != "pair" or not wide:
            break
    if by_launch and layout_forced is None and impl == "pair":  # rn72 where 72-row blocks save enough rows
        t72 = -(-rows // _RN72_ROWS)
        s72 = splits or choose_splits(t72 * batch, kv, num_sms, batch * rows, wide=True)
        fills = _RN72_MIN_FILL * num_sms <= t72 * batch * s72 <= num_sms
        saves = (t72 * _RN72_ROWS <= _RN72_MAX_ROW_SHARE * (blocks // batch) * tile
                 and -(-kv // _FUSED_BN) >= _RN72_MIN_KV_TILES)
        if saves and (s72 <= _RN72_MAX_SPLITS or fills):
            impl, layout, tile, s = "rn72", "rows_n", _RN72_ROWS, s72
    if variant == "fused" and impl == "pair" and splits is None:
        s, head, ts = choose_tail(blocks, kv, num_sms, s)
        if head:
            return LaunchPlan("fused", impl, layout, tile, s, max(ts, s if s > 1 else 0), 2, head, ts)
    if variant == "fused":
        return LaunchPlan("fused", impl, layout, tile, s, s if s > 1 else 0, 2 if s > 1 else 1)
    return LaunchPlan("cascade", impl, layout, tile, s, s + 1, 3)


def _run_cuda(variant, q, kv, prefix_lens, tree, scale, out, lse, splits=None, impl=None, layout=None):
    """Launch a CUDA variant into ``out``/``lse`` following ``launch_plan``.

    ``splits`` overrides the KV split heuristic, ``impl`` (one of ``FUSED_IMPLS``) the fused kernel
    that ``fused`` and ``cascade`` run (default: ``default_impl`` of the device), ``layout``
    (``"rows_m"``/``"rows_n"``) the fused kernel's layout.
    """
    from kdtree.kernels import launch, ptr

    B, N, H, _ = q.shape
    S = kv.shape[1]
    pl = prefix_lens if prefix_lens.dtype == torch.int32 else prefix_lens.to(torch.int32)
    vis = tree.visibility
    scale_log2 = scale * _LOG2E
    if variant == "naive":
        fn = _kernel("verify_naive", _index(q.device))
        launch(fn, (H, N, B), (256,), (ptr(q), ptr(kv), ptr(pl), ptr(vis), ptr(out), ptr(lse), np.int32(B),
                                       np.int32(S), np.int32(N), np.int32(H), np.int32(vis.shape[2]),
                                       np.float32(scale_log2)), device=q.device)
        return
    plan = launch_plan(variant, batch=B, nodes=N, heads=H, kv_rows=S, num_sms=_num_sms(_index(q.device)),
                       impl=impl or (None if layout == "rows_n" else default_impl(_index(q.device))),
                       splits=splits, layout=layout)
    s = plan.splits
    kern = (plan.impl, plan.layout, plan.tile_rows, q, kv, pl, vis, out, lse)
    if plan.partial_slots == 0:
        _launch_fused(*kern, None, None, 1, 0, 0, scale_log2)
        return
    o_part = torch.empty((plan.partial_slots, B, N * H, D_V), dtype=PARTIAL_DTYPE, device=q.device)
    lse_part = torch.empty((plan.partial_slots, B, N * H), dtype=torch.float32, device=q.device)
    if plan.head:  # whole (or split) head row tiles, then the tail's splits; the combine from the first partial row
        _launch_fused(*kern, o_part, lse_part, s, 0, 0, scale_log2, plan.head, plan.tail_splits)
        gx = -(-(N * H) // plan.tile_rows)
        tail_row = plan.head // gx * N * H + plan.head % gx * plan.tile_rows
        _launch_combine(o_part, lse_part, out, lse, s, 0 if s > 1 else tail_row, tail_row, plan.tail_splits)
        return
    if variant == "fused":
        _launch_fused(*kern, o_part, lse_part, s, 0, 0, scale_log2)
    else:  # cascade: prefix pass (split), tree pass, merge
        _launch_fused(*kern, o_part, lse_part, s, 0, 1, scale_log2)
        _launch_fused(*kern, o_part, lse_part, 1, s, 2, scale_log2)
    _launch_combine(o_part, lse_part, out, lse)


def verify_attention(q, kv, prefix_lens, tree, scale, variant="auto", *, out=None, check_values=True):
    """Tree-verify MLA-absorb attention over the prefix and the draft tree.

    Parameters
    ----------
    q : torch.Tensor, bf16 [B, N, H, 576]
        Absorbed queries of the N tree nodes; H in (8, 16, 32, 64, 128), N <= 1025.
    kv : torch.Tensor, bf16 [B, S, 576]
        Latent cache; the tree rows of sequence b sit at ``prefix_lens[b] .. prefix_lens[b] + N - 1``.
    prefix_lens : torch.Tensor, int32 or int64 [B]
        Prefix length per sequence (0 allowed); ``prefix_lens + N <= S``.
    tree : kdtree.Tree
        Its ``visibility`` [B, N, ceil(N / 64)] int64 marks, per node, the tree rows it sees
        (its ancestors and itself; bits of nodes after its own are ignored, since a parent
        precedes its child).
    scale : float
        Softmax scale applied to q . k.
    variant : {"auto", "fused", "cascade", "naive", "torch"}
        ``auto`` runs ``fused`` on CUDA tensors and ``torch`` otherwise.
    out : tuple of torch.Tensor, optional
        Preallocated ``(out, lse)`` to write into.
    check_values : bool
        Check prefix lengths against S (one host synchronisation). Skipped during graph capture.

    Returns
    -------
    out : torch.Tensor, bf16 [B, N, H, 512]
    lse : torch.Tensor, float32 [B, N, H]
        Natural-log sum of exp of the scaled scores; a row that sees no key (padding node with an
        empty prefix) gets ``out = 0`` and ``lse = -inf``.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, before anything is launched or written.
    """
    _validate(q, kv, prefix_lens, tree, scale, variant, check_values, out)
    if variant == "auto":
        variant = "fused" if q.device.type == "cuda" else "torch"
    if variant == "torch":
        o, lse = _torch_variant(q, kv, prefix_lens, tree, float(scale))
        if out is None:
            return o, lse
        out[0].copy_(o)
        out[1].copy_(lse)
        return out
    B, N, H, _ = q.shape
    if out is None:
        out = (torch.empty((B, N, H, D_V), dtype=torch.bfloat16, device=q.device),
               torch.empty((B, N, H), dtype=torch.float32, device=q.device))
    _run_cuda(variant, q, kv, prefix_lens, tree, float(scale), out[0], out[1])
    return out


# ---- helpers the benchmark (kdtree.bench.attention_bench) shares with the tests ----

def random_parents(B: int, N: int, num_nodes, gen: torch.Generator) -> torch.Tensor:
    """Random tree parents [B, N] (a parent precedes its child; -1 for root and padding)."""
    parents = torch.full((B, N), -1, dtype=torch.int32)
    for b in range(B):
        n = int(num_nodes[b])
        for i in range(1, n):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
    return parents


def errors(out, lse, ref_out, ref_lse):
    """(relative Frobenius error of out, max abs lse error over finite rows, -inf pattern equal)."""
    o, r = out.double().cpu(), ref_out.double().cpu()
    rel = float((o - r).norm() / r.norm().clamp_min(1e-300))
    l, rl = lse.double().cpu(), ref_lse.double().cpu()
    fin = torch.isfinite(rl)
    same_inf = bool(torch.equal(fin, torch.isfinite(l)))
    lse_err = float((l[fin] - rl[fin]).abs().max()) if bool(fin.any()) else 0.0
    if bool(torch.isnan(o).any()) or bool(torch.isnan(l).any()):
        rel = float("nan")
    return rel, lse_err, same_inf
