// The tile machinery both fused verify-attention kernels share (mma.sync in
// verify_attention.cu, wgmma in verify_attention_wgmma.cu): block shape, shared-memory layout,
// KV range of a split, the tile loader, the masked online-softmax step and the epilogue writes.
#ifndef KDTREE_ATTENTION_TILE_CUH
#define KDTREE_ATTENTION_TILE_CUH

#include "attention_common.cuh"

#define FUSED_BM 64        // (query, head) rows per block
#define FUSED_BN 64        // KV rows per pipeline stage
#define FUSED_THREADS 256  // 8 warps = 2 warpgroups
#define QK_CHUNKS (ATT_D_QK / 8)  // 16-byte chunks per q / kv row (72)

static_assert(ATT_D_QK % 64 == 0, "rows are whole 64-column (128-byte) swizzle blocks");

// Shared memory (bytes): Q tile, two KV stages, P tile (64 x 64 bf16), then fp32 row
// statistics [3][BM] (two column groups' partial max / sum, and a per-row value: alpha or the
// final max). The base is rounded up to 1024 B (the 128-byte swizzle repeats every 8 rows of
// 128 B, and wgmma computes it from address bits), hence the extra 1024.
#define FUSED_SMEM_Q (FUSED_BM * ATT_D_QK * 2)
#define FUSED_SMEM_KV (FUSED_BN * ATT_D_QK * 2)
#define FUSED_SMEM_P (FUSED_BM * FUSED_BN * 2)
#define FUSED_SMEM_STATS (3 * FUSED_BM * 4)
#define FUSED_SMEM_BYTES (FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P + FUSED_SMEM_STATS + 1024)

// Byte offset of 16-byte chunk cg of row r in a [rows x 8k] bf16 tile stored as k column blocks
// of 64 values, each [rows x 128 B] with the 128-byte swizzle (chunk ^ (row & 7)). This is the
// canonical K-major SW128 layout wgmma reads, and the 8 rows one ldmatrix matrix touches land
// in 8 different bank groups.
__device__ __forceinline__ att_u32 fused_off(int r, int cg, int rows) {
  return (att_u32)((cg >> 3) * rows * 128 + r * 128 + (((cg & 7) ^ (r & 7)) << 4));
}

// Copy rows [0, ROWS) of a [*, 576] bf16 matrix into a tile; rows at or past `valid` are
// zero-filled (nothing is read for them). One cp.async group is left for the caller to commit.
template <int ROWS>
__device__ __forceinline__ void fused_load_rows(att_u32 dst, const att_bf16* src, int valid, int tid) {
  static_assert((ROWS * QK_CHUNKS) % FUSED_THREADS == 0, "whole chunks per thread");
#pragma unroll
  for (int k = 0; k < ROWS * QK_CHUNKS / FUSED_THREADS; ++k) {
    const int i = tid + k * FUSED_THREADS;
    const int r = i / QK_CHUNKS, c = i - r * QK_CHUNKS;
    const bool ok = r < valid;
    att_cp_async16(dst + fused_off(r, c, ROWS), ok ? src + (size_t)r * ATT_D_QK + c * 8 : src, ok ? 16 : 0);
  }
}

// What one block (row tile blockIdx.x, split blockIdx.y, sequence blockIdx.z) covers.
struct FusedBlock {
  int b, split, NH, g0;  // sequence, split, rows per sequence, first (query, head) row
  int p, lo, hi;         // clamped prefix length and the pass's KV range [lo, hi)
  int kt0, kt1;          // this split's KV tiles
  bool direct;           // a whole row tile in a head/tail launch (fused_block_ht): out and lse, no partial
};

// The tree node of tile row r (padding rows past N * H count as the last node).
__device__ __forceinline__ int fused_row_node(const FusedBlock& k, int N, int H, int r) {
  return min((k.g0 + r) / H, N - 1);
}

// Where tile row r's keys end: past its own node's cache row (p + node + 1), and never past the
// pass's range end. Visibility bits of nodes after the row's own are ignored, as in the reference.
__device__ __forceinline__ int fused_row_end(const FusedBlock& k, int N, int H, int r) {
  return min(k.hi, k.p + fused_row_node(k, N, H, r) + 1);
}

// A tree row sees only its ancestors and itself, and a parent precedes its child, so the tree
// rows past the block's last node are masked for every row of the block: the range ends after it
// (node n's row of the cache is p + n). At H = 64 a block holds one node, and a node halfway down
// an N = 513 tree walks 256 tree rows fewer than the whole tree's.
__device__ __forceinline__ FusedBlock fused_block_at(const int* prefix_lens, int S, int N, int H, int splits,
                                                     int mode, int tile_rows, int b, int x, int split) {
  FusedBlock k;
  k.b = b;
  k.split = split;
  k.NH = N * H;
  k.g0 = x * tile_rows;
  k.direct = false;
  k.p = att_prefix(prefix_lens, k.b, N, S);
  att_kv_range(mode, k.p, N, k.lo, k.hi);
  k.hi = min(k.hi, fused_row_end(k, N, H, tile_rows - 1));
  const int n_tiles = (k.hi - k.lo + FUSED_BN - 1) / FUSED_BN;
  const int per_split = (n_tiles + splits - 1) / splits;
  k.kt0 = k.split * per_split;
  k.kt1 = min(n_tiles, k.kt0 + per_split);
  return k;
}

// The block of a (row tile, split, sequence) grid.
__device__ __forceinline__ FusedBlock fused_block(const int* prefix_lens, int S, int N, int H, int splits,
                                                  int mode, int tile_rows = FUSED_BM) {
  return fused_block_at(prefix_lens, S, N, H, splits, mode, tile_rows, blockIdx.z, blockIdx.x, blockIdx.y);
}

// The block of a head/tail launch (a 1-D grid): the launch's B x ceil(N H / 64) row tiles are
// numbered sequence-major; the first `head` of them run in `splits` splits (1: whole, writing out
// and lse directly), the rest (the tail) in `tail_splits`. Blocks go split-major within each part,
// head first, so the hardware, which hands out blocks in index order, starts the tail's short
// blocks on the SMs the head's last partial wave leaves idle and on each SM as its head block ends
// (kdtree.attention.choose_tail says when that beats one split count for all).
__device__ __forceinline__ FusedBlock fused_block_ht(const int* prefix_lens, int S, int N, int H, int B,
                                                     int splits, int head, int tail_splits, int mode) {
  const int gx = (N * H + FUSED_BM - 1) / FUSED_BM, n_head = head * splits;
  int f, split, s;
  if ((int)blockIdx.x < n_head) {
    f = blockIdx.x % head;
    split = blockIdx.x / head;
    s = splits;
  } else {
    const int t = blockIdx.x - n_head, tail = B * gx - head;
    f = head + t % tail;
    split = t / tail;
    s = tail_splits;
  }
  FusedBlock k = fused_block_at(prefix_lens, S, N, H, s, mode, FUSED_BM, f / gx, f % gx, split);
  k.direct = s == 1;
  return k;
}

// The block's Q rows (rows at or past q_valid zero-filled) and the first KV tile of its split,
// as one cp.async group; nothing when the split has no tiles.
__device__ __forceinline__ void fused_load_first(att_u32 sQ, att_u32 sKV, const att_bf16* __restrict__ q,
                                                 const att_bf16* __restrict__ kvb,
                                                 const FusedBlock& k, int q_valid, int tid) {
  if (k.kt0 < k.kt1) {
    fused_load_rows<FUSED_BM>(sQ, q + ((size_t)k.b * k.NH + k.g0) * ATT_D_QK, q_valid, tid);
    const int t0 = k.lo + k.kt0 * FUSED_BN;
    fused_load_rows<FUSED_BN>(sKV, kvb + (size_t)t0 * ATT_D_QK, k.hi - t0, tid);
    att_cp_async_commit();
  }
}

// Top of the tile loop: wait for tile kt, synchronise the block (every warp is done with tile
// kt - 1), then prefetch tile kt + 1 into the other stage. ASYNC_PROXY: the tile is read by wgmma,
// so the cp.async writes are fenced for the async proxy first. Returns tile kt's stage.
template <bool ASYNC_PROXY>
__device__ __forceinline__ att_u32 fused_next_tile(att_u32 sKV, const att_bf16* kvb, const FusedBlock& k, int kt,
                                                   int tid) {
  const att_u32 sK = sKV + ((kt - k.kt0) & 1) * FUSED_SMEM_KV;
  att_cp_async_wait_all();
  if (ASYNC_PROXY) att_fence_proxy_async();
  __syncthreads();
  if (kt + 1 < k.kt1) {
    const int t1 = k.lo + (kt + 1) * FUSED_BN;
    fused_load_rows<FUSED_BN>(sKV + ((kt + 1 - k.kt0) & 1) * FUSED_SMEM_KV, kvb + (size_t)t1 * ATT_D_QK, k.hi - t1,
                              tid);
    att_cp_async_commit();
  }
  return sK;
}

// A thread's two rows r_lo / r_hi = r_lo + 8 of the tile (the mma / wgmma accumulator layout):
// their queries' visibility rows (padding rows past N * H use the last query's). Where their keys
// end (fused_row_end) is recomputed on the few tiles that mask, not kept through the tile loop.
struct FusedRows {
  const long long *v_lo, *v_hi;
  int r_lo, N, H;
};

__device__ __forceinline__ FusedRows fused_rows(const long long* vis, const FusedBlock& k, int N, int H, int W,
                                                int r_lo) {
  const long long* v = vis + (size_t)k.b * N * W;
  return {v + (size_t)fused_row_node(k, N, H, r_lo) * W, v + (size_t)fused_row_node(k, N, H, r_lo + 8) * W, r_lo,
          N, H};
}

// Bit c set when absolute KV position base + c (c in 0..63) is visible to the query whose
// visibility row is vrow (W words): before the row's key end hi (fused_row_end), and in the prefix
// or a visible tree node. Branch-free apart from the row's (at most two) word loads, so that a tile's masking
// costs a few dozen instructions; written per element with a load each, ptxas turned the masking
// into 32 guarded branches that every tile paid for, edge or not (1.2 us of a 2.5 us tile on an
// H200, traced).
__device__ __forceinline__ att_u64 att_visible_bits(int base, int p, int hi, const long long* vrow, int W) {
  const int j0 = base - p;  // tree node of bit 0 (negative: bit 0 lies in the prefix)
  att_u64 bits;
  if (j0 >= 0) {
    const int w = j0 >> 6, sh = j0 & 63;
    const att_u64 lo = w < W ? (att_u64)vrow[w] : 0ull;
    const att_u64 up = (sh != 0 && w + 1 < W) ? (att_u64)vrow[w + 1] : 0ull;
    bits = (lo >> sh) | (sh != 0 ? up << (64 - sh) : 0ull);
  } else {
    const int pre = -j0;  // prefix positions at the start of the window
    bits = pre >= 64 ? ~0ull : (((att_u64)vrow[0]) << pre) | ((1ull << pre) - 1ull);
  }
  const int valid = hi - base;
  return valid >= 64 ? bits : valid <= 0 ? 0ull : bits & ((1ull << valid) - 1ull);
}

// S^T of a rows_n tile in the wgmma accumulator layout, this thread's s[4 j + 2 e + c] at token
// T + 16 wq + gid + 8 e and block row r0 + 8 j + 2 tig + c (NJ groups of 8 rows): scale to the
// log2 domain and mask keys past each row's end or invisible tree rows. The edge test stays
// outside the row loop: inside it, ptxas kept one guarded region (a BSSY / BSYNC pair) per row
// pair on every tile, masked or not, about 1500 of rn72's 6800-cycle tile on an H100 (Nsight
// Compute's samples, docs/perf_log.md, session 36), the trap att_visible_bits records above.
template <int NJ>
__device__ __forceinline__ void rows_n_scale_mask(float* s, const FusedBlock& k, int T, int r0, int wq, int gid,
                                                  int tig, const long long* vis, int N, int H, int W,
                                                  float scale_log2) {
#pragma unroll
  for (int e = 0; e < 4 * NJ; ++e) s[e] *= scale_log2;
  if ((T + FUSED_BN > k.p) || (T + FUSED_BN > k.hi)) {
    const int t0 = T + 16 * wq + gid;
#pragma unroll
    for (int ci = 0; ci < 2 * NJ; ++ci) {
      const int r = r0 + 8 * (ci >> 1) + 2 * tig + (ci & 1), end = fused_row_end(k, N, H, r);
      const long long* vrow = vis + ((size_t)k.b * N + fused_row_node(k, N, H, r)) * W;
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (t0 + 8 * e >= end || !att_kv_visible(t0 + 8 * e, k.p, vrow))
          s[4 * (ci >> 1) + 2 * e + (ci & 1)] = ATT_NEG_INF;
    }
  }
}

// P, the exponentials of a rows_n tile (s in rows_n_scale_mask's layout), as bf16 into the K-major
// P tile of `rows` rows: block row r0 + 8 j + 2 tig + c, token 16 wq + gid + 8 e. A thread's pair
// s[4 j + 2 e + {0, 1}] is its fragment row of the m8n8 matrix (j, e) (8 tokens x 8 block rows),
// and stmatrix .trans writes that matrix as 8 block rows of 8 tokens, 16 bytes each: the tile's
// K-major chunks. One x4 instruction stores two j of a warp, where st.shared.b16 took one
// instruction per value and thread (36 for rn72's 72 rows, 0.12 of warpgroup 0's tile loop with
// the exponentials on an H100, docs/perf_log.md, session 36). r0 is a multiple of 8.
template <int NJ>
__device__ __forceinline__ void rows_n_store_p(const float* s, att_u32 sP, int r0, int rows, int wq, int lane) {
  const int q = lane >> 3, r = lane & 7;  // lane names row r of matrix q: (j + q / 2, e = q % 2) for an x4
#pragma unroll
  for (int j = 0; j + 1 < NJ; j += 2) {
    const att_u32 a = sP + fused_off(r0 + 8 * (j + (q >> 1)) + r, 2 * wq + (q & 1), rows);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a),
                 "r"(att_pack_bf16x2(s[4 * j], s[4 * j + 1])), "r"(att_pack_bf16x2(s[4 * j + 2], s[4 * j + 3])),
                 "r"(att_pack_bf16x2(s[4 * j + 4], s[4 * j + 5])), "r"(att_pack_bf16x2(s[4 * j + 6], s[4 * j + 7])));
  }
  if constexpr (NJ % 2 == 1) {  // the last j alone: lanes 0-15 address its two matrices
    constexpr int j = NJ - 1;
    const att_u32 a = sP + fused_off(r0 + 8 * j + r, 2 * wq + (q & 1), rows);
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(a),
                 "r"(att_pack_bf16x2(s[4 * j], s[4 * j + 1])), "r"(att_pack_bf16x2(s[4 * j + 2], s[4 * j + 3])));
  }
}

// S of this thread's rows r_lo / r_hi = r_lo + 8 over KV columns col0 + 8 nt + 2 tig + {0, 1}
// of tile T (NT n8 tiles in the mma / wgmma accumulator layout): scale to the log2 domain, mask
// keys past each row's end or invisible tree rows (only on tiles that reach them: a warp-uniform
// branch around att_visible_bits), and return the row maxima reduced over the quad.
template <int NT>
__device__ __forceinline__ void fused_scale_mask_max(float (&s)[NT][4], const FusedBlock& k, int T, int col0,
                                                     int tig, const FusedRows& vr, int W, float scale_log2,
                                                     float& mx_lo, float& mx_hi) {
  static_assert(NT <= 8, "a thread's columns span at most 64 positions");
  if ((T + col0 + 8 * NT > k.p) || (T + col0 + 8 * NT > k.hi)) {
    // fused_row_end with a shift for the division: H is a power of two (verify_attention checks it)
    const int hs = __ffs(vr.H) - 1, n_lo = min((k.g0 + vr.r_lo) >> hs, vr.N - 1);
    const int n_hi = min((k.g0 + vr.r_lo + 8) >> hs, vr.N - 1);
    const int e_lo = min(k.hi, k.p + n_lo + 1), e_hi = min(k.hi, k.p + n_hi + 1);
    const att_u64 m_lo = att_visible_bits(T + col0, k.p, e_lo, vr.v_lo, W) >> (2 * tig);
    const att_u64 m_hi = att_visible_bits(T + col0, k.p, e_hi, vr.v_hi, W) >> (2 * tig);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!(((e < 2 ? m_lo : m_hi) >> (8 * nt + (e & 1))) & 1ull)) s[nt][e] = ATT_NEG_INF;
  }
  mx_lo = ATT_NEG_INF;
  mx_hi = ATT_NEG_INF;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] *= scale_log2;
    mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
  }
}

// The max half of an online-softmax step for one row: tile max `tmx` (over every column group)
// -> new running max m, the exponent offset mu of the row's p (m, or 0 for a row that has seen no
// key yet), and the rescale factor of the old state (returned). It needs no exponential of the
// tile, so a kernel can publish m and the factor before fused_exp_row runs.
__device__ __forceinline__ float fused_max_step(float tmx, float& m, float& mu) {
  const float mn = fmaxf(m, tmx);
  mu = mn == ATT_NEG_INF ? 0.f : mn;  // a row that has seen no key yet
  const float alpha = att_exp2(m - mu);
  m = mn;
  return alpha;
}

// The exponential half (elements E, E + 1 of each of the NT n8 tiles): p = 2^(s - mu) in place
// and this thread's partial row sum l, rescaled by alpha (reduced over the row once, at the end).
template <int E, int NT>
__device__ __forceinline__ void fused_exp_row(float (&s)[NT][4], float mu, float alpha, float& l) {
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][E] = att_exp2(s[nt][E] - mu);
    s[nt][E + 1] = att_exp2(s[nt][E + 1] - mu);
    sum += s[nt][E] + s[nt][E + 1];
  }
  l = l * alpha + sum;
}

// One online-softmax step for one row (elements E, E + 1 of each of the NT n8 tiles): both halves
// above, in order; returns the rescale factor of the old state.
template <int E, int NT>
__device__ __forceinline__ float fused_softmax_row(float (&s)[NT][4], float tmx, float& m, float& l) {
  float mu;
  const float alpha = fused_max_step(tmx, m, mu);
  fused_exp_row<E>(s, mu, alpha, l);
  return alpha;
}

// P (rows r_lo / r_hi of s, already exponentiated) as bf16 into the P tile, column group cg:
// tokens 8 NT cg .. + 8 NT - 1.
template <int NT>
__device__ __forceinline__ void fused_store_p(const float (&s)[NT][4], att_u32 sP, int r_lo, int r_hi, int cg,
                                              int tig) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int ch = NT * cg + nt;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + fused_off(r_lo, ch, FUSED_BM) + 4 * tig),
                 "r"(att_pack_bf16x2(s[nt][0], s[nt][1])));
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + fused_off(r_hi, ch, FUSED_BM) + 4 * tig),
                 "r"(att_pack_bf16x2(s[nt][2], s[nt][3])));
  }
}

// Softmax step for rows r_lo / r_hi, then P as bf16 into the P tile (fused_store_p). Returns the
// rescale factors of the two rows.
template <int NT>
__device__ __forceinline__ void fused_softmax_store_p(float (&s)[NT][4], float tmx_lo, float tmx_hi, float& m_lo,
                                                      float& m_hi, float& l_lo, float& l_hi, float& al_lo,
                                                      float& al_hi, att_u32 sP, int r_lo, int r_hi, int cg,
                                                      int tig) {
  al_lo = fused_softmax_row<0>(s, tmx_lo, m_lo, l_lo);
  al_hi = fused_softmax_row<2>(s, tmx_hi, m_hi, l_hi);
  fused_store_p(s, sP, r_lo, r_hi, cg, tig);
}

// Store two adjacent output values of tile row r, value column col, as bf16: into out, or, for a
// split, normalised into this split's partial slot.
__device__ __forceinline__ void fused_store_pair(att_bf16* out, att_bf16* o_part, const FusedBlock& k, int B,
                                                 int slot0, int r, int col, float x0, float x1) {
  const size_t row = o_part == nullptr ? (size_t)k.b * k.NH + k.g0 + r
                                       : ((size_t)(slot0 + k.split) * B + k.b) * k.NH + k.g0 + r;
  *reinterpret_cast<att_u32*>((o_part == nullptr ? out : o_part) + row * ATT_D_V + col) = att_pack_bf16x2(x0, x1);
}

// Rescale the O rows a thread holds in the wgmma m64n256 accumulator layout (see below) by their
// online-softmax factors. Skipped by the whole warp when none of its rows' maxima moved (every factor
// exactly 1, 2^0): past the first tiles most do not, and the 128 multiplies sit between a tile's
// publish and its P V on the kernels' critical path. (Around the retired v7 schedule this branch
// made ptxas serialise the wgmmas, C7518: the register test would say so.)
__device__ __forceinline__ void fused_rescale_o(float (&o)[128], float al_lo, float al_hi) {
  if (!__any_sync(0xffffffffu, al_lo != 1.f || al_hi != 1.f)) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= al_lo;
    o[4 * j + 1] *= al_lo;
    o[4 * j + 2] *= al_hi;
    o[4 * j + 3] *= al_hi;
  }
}

// One butterfly step of att_quad_transpose: the lanes with `up` set send words a0, a1 to their
// partner (lane ^ mask) and take its words in their place; the others send and replace b0, b1.
__device__ __forceinline__ void att_quad_step(att_u32& a0, att_u32& a1, att_u32& b0, att_u32& b1, bool up, int mask) {
  const att_u32 x0 = __shfl_xor_sync(0xffffffffu, up ? a0 : b0, mask);
  const att_u32 x1 = __shfl_xor_sync(0xffffffffu, up ? a1 : b1, mask);
  if (up) {
    a0 = x0;
    a1 = x1;
  } else {
    b0 = x0;
    b1 = x1;
  }
}

// A quad's (lanes 4 gid .. 4 gid + 3, tig = lane & 3) 4 x 4 words transposed in registers: lane t's
// word c becomes lane c's word t (two butterfly steps, xor 2 then xor 1). Every lane of the warp
// calls it.
__device__ __forceinline__ void att_quad_transpose(att_u32 (&w)[4], int tig) {
  att_quad_step(w[0], w[1], w[2], w[3], tig & 2, 2);
  att_quad_step(w[0], w[2], w[1], w[3], tig & 1, 1);
}

// The O rows r_lo and r_lo + 8 a warpgroup holds in the wgmma m64n256 accumulator layout (o[4 j],
// o[4 j + 1]: row r_lo; o[4 j + 2], o[4 j + 3]: row r_lo + 8; value columns 256 wg + 8 j + 2 tig
// + {0, 1}), normalised by the row sums of the two warpgroups (sSum[r] + sSum[BM + r]) and stored
// as bf16 into out or, for a split, into its partial slot. A quad holds 16 bytes of a row per j,
// each lane 4 of them; 4-byte stores leave every 32-byte sector half written per instruction, and
// the pair traces showed blocks with bf16 rows ending later after their last P V than blocks
// writing twice the bytes as fp32 partials (docs/perf_log.md, session 18). So each quad transposes
// its words over j = 4 m .. 4 m + 3 and lane tig stores j = 4 m + tig's 16 bytes: 64 contiguous
// bytes a row per instruction.
// 1 / (row r's sum over both column groups, sSum[r] + sSum[BM + r]), or 0 for a row that saw no
// key: what the row's O is multiplied by before it is stored.
__device__ __forceinline__ float fused_row_inv_sum(const float* sSum, int r) {
  const float l = sSum[r] + sSum[FUSED_BM + r];
  return l > 0.f ? 1.f / l : 0.f;
}

__device__ __forceinline__ void fused_store_o_half(const float (&o)[128], att_bf16* out, att_bf16* o_part,
                                                   const FusedBlock& k, int B, int slot0, int r_lo, int wg,
                                                   int tig, const float* sSum) {
  // the sequence's rows of out, or of this split's partial slot
  att_bf16* const seq = o_part == nullptr ? out + (size_t)k.b * k.NH * ATT_D_V
                                          : o_part + ((size_t)(slot0 + k.split) * B + k.b) * k.NH * ATT_D_V;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r_lo + 8 * half;
    const bool valid = k.g0 + r < k.NH;
    const float inv = fused_row_inv_sum(sSum, r);
    att_bf16* row = seq + (size_t)(k.g0 + r) * ATT_D_V + 256 * wg;
#pragma unroll
    for (int m = 0; m < 8; ++m) {  // (the shuffles run on every lane; only the stores skip padding rows)
      att_u32 w[4];
#pragma unroll
      for (int c = 0; c < 4; ++c)
        w[c] = att_pack_bf16x2(o[4 * (4 * m + c) + 2 * half] * inv, o[4 * (4 * m + c) + 2 * half + 1] * inv);
      att_quad_transpose(w, tig);
      if (valid) *reinterpret_cast<uint4*>(row + 8 * (4 * m + tig)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// lse of the tile's rows from the two column groups' row sums (sSum[0..BM), sSum[BM..2BM)) and
// the final row max (sMax): natural log into lse, or log2 into the split's partial slot.
// Row r of the block's lse from its max m2 and row sum (log2; -inf without a visible key): into
// lse (natural log) or, for a split's partials, into lse_part (log2). The rows_n kernels' end;
// fused_store_lse below computes the same, written out: through this helper its kernels' SASS
// changed (address arithmetic), which only a GPU run could clear.
__device__ __forceinline__ void fused_write_lse(float* lse, float* lse_part, bool partial, const FusedBlock& k,
                                                int B, int slot0, int r, float m2, float sum) {
  const float lse2 = sum > 0.f ? m2 + att_log2(sum) : ATT_NEG_INF;
  const size_t g = (size_t)k.b * k.NH + k.g0 + r;
  if (partial)
    lse_part[(size_t)(slot0 + k.split) * B * k.NH + g] = lse2;
  else
    lse[g] = lse2 * ATT_LN2;
}

__device__ __forceinline__ void fused_store_lse(float* lse, float* lse_part, bool partial, const FusedBlock& k,
                                                int B, int slot0, const float* sSum, const float* sMax, int tid) {
  if (tid >= FUSED_BM || k.g0 + tid >= k.NH) return;
  const float l = sSum[tid] + sSum[FUSED_BM + tid];
  const float lse2 = l > 0.f ? sMax[tid] + att_log2(l) : ATT_NEG_INF;
  if (partial)
    lse_part[((size_t)(slot0 + k.split) * B + k.b) * k.NH + k.g0 + tid] = lse2;
  else
    lse[(size_t)k.b * k.NH + k.g0 + tid] = lse2 * ATT_LN2;
}

// The block's dynamic shared memory, with its base rounded up to 1024 bytes.
__device__ __forceinline__ unsigned char* fused_smem_base(unsigned char* raw) {
  const att_u32 a = att_smem_addr(raw);
  return raw + (((a + 1023u) & ~1023u) - a);
}

#endif  // KDTREE_ATTENTION_TILE_CUH
