// verify_fused_rows_n<NW>: the fused verify attention on wgmma (sm_90a) in the transposed layout,
// for sequences with few (query, head) rows. Same arguments, split/partial protocol and
// shared-memory tiles as verify_fused (verify_attention.cu, see there for the contract), plus
// `tile_rows`: the rows every block computes, a multiple of 8 up to 64, 2 NW or 2 NW - 8
// (grid.x = ceil(N H / tile_rows); the last block's rows past N H are padding).
//
// The KV tokens sit on wgmma's M (the 64 tokens of a tile), the block's rows on N, so a tile
// of 40 rows costs 40 columns of tensor work instead of a padded 64-row M tile:
//   S^T[64 tokens x rows] = K Q^T           (A = K tile, K-major; B = Q, K-major)
//   O^T[512 x rows]      += V^T P^T          (A = V^T: the KV tile read MN-major; B = P, K-major)
// Warpgroup g owns rows r0 .. r0 + nw - 1 of the block (the 8-row groups split between the two
// warpgroups, nw in {0, 8, 16, 24, 32}) for S^T, the softmax and O^T; the two warpgroups share
// only the Q and KV tiles. The softmax runs along M: a column's max over the 64 tokens is
// reduced in registers over the 8 lanes that hold it, then over the 4 warps through shared
// memory (a named barrier per warpgroup); its running sum stays a per-thread partial until the
// end. A thread holds the same columns in S^T and O^T, so the rescale stays in registers.
#include "attention_common.cuh"
#include "attention_tile.cuh"
#include "attention_wgmma.cuh"

#define RN_WG_ROWS 32                                // most rows per warpgroup
#define RN_SMEM_RED (2 * 4 * RN_WG_ROWS * 4)         // [warpgroup][warp][row] floats
#define RN_SMEM_BYTES (FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P + RN_SMEM_RED + 1024)
static_assert(2 * RN_WG_ROWS == FUSED_BM, "the Q and P tiles hold the block's rows");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Everything one warpgroup needs to process a tile.
struct RnWarpgroup {
  att_u32 sQ, sP;  // Q and P tiles (K-major, rows of the block)
  float* red;      // this warpgroup's [4 warps][RN_WG_ROWS] reduction slots
  int r0;          // first block row of the warpgroup
  int wq, gid, tig, bar;
};

__device__ __forceinline__ void rn_bar(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

// This thread's accumulator s[4 j + 2 e2 + c2] (and o[i * NW / 2 + ...] alike) sits at token
// (M) 16 wq + gid + 8 e2 and row (N) 8 j + 2 tig + c2; ci = 2 j + c2 numbers its columns.
template <int NW, int OS>
__device__ __forceinline__ void rn_tile(float* o, float* m, float* l, att_u32 sK, const RnWarpgroup& w,
                                        const FusedBlock& k, const long long* vis, int N, int H, int W, int T,
                                        float scale_log2) {
  constexpr int NJ = NW / 8;
  // Operand bases kept opaque, so that the compiler forms each descriptor next to its wgmma
  // instead of hoisting all 68 out of the tile loop into registers.
  att_u32 kb = sK, qb = w.sQ + w.r0 * 128, pb = w.sP + w.r0 * 128;
  asm volatile("" : "+r"(kb), "+r"(qb), "+r"(pb));
  float s[NW / 2];
#pragma unroll
  for (int i = 0; i < NW / 2; ++i) s[i] = 0.f;
  wg_pin<NW / 2>(s);
  wg_fence();
#pragma unroll
  for (int ks = 0; ks < ATT_D_QK / 16; ++ks) {
    const att_u32 blk = (ks >> 2) * (FUSED_BN * 128), kk = (ks & 3) * 32;
    wg_mma<NW, 0>(s, wg_desc(kb + blk + kk, 16, 1024), wg_desc(qb + blk + kk, 16, 1024));
  }
  wg_commit();
  wg_wait_all();
  wg_pin<NW / 2>(s);

  // Scale to the log2 domain, mask (only on tiles that reach the tree rows or the range end),
  // and each column's max over this thread's two tokens, the warp's 16, then the 64.
  rows_n_scale_mask<NJ>(s, k, T, w.r0, w.wq, w.gid, w.tig, vis, N, H, W, scale_log2);
  float mx[NW / 4];
#pragma unroll
  for (int ci = 0; ci < NW / 4; ++ci) mx[ci] = fmaxf(s[4 * (ci >> 1) + (ci & 1)], s[4 * (ci >> 1) + 2 + (ci & 1)]);
#pragma unroll
  for (int ci = 0; ci < NW / 4; ++ci) {
#pragma unroll
    for (int off = 4; off <= 16; off <<= 1) mx[ci] = fmaxf(mx[ci], __shfl_xor_sync(0xffffffffu, mx[ci], off));
    if (w.gid == 0) w.red[w.wq * RN_WG_ROWS + 8 * (ci >> 1) + 2 * w.tig + (ci & 1)] = mx[ci];
  }
  rn_bar(w.bar);  // the four warps' column maxima are in red

  float alpha[NW / 4];
#pragma unroll
  for (int ci = 0; ci < NW / 4; ++ci) {
    const int col = 8 * (ci >> 1) + 2 * w.tig + (ci & 1);
    const float tmx = fmaxf(fmaxf(w.red[col], w.red[RN_WG_ROWS + col]),
                            fmaxf(w.red[2 * RN_WG_ROWS + col], w.red[3 * RN_WG_ROWS + col]));
    const float mn = fmaxf(m[ci], tmx);
    const float mu = mn == ATT_NEG_INF ? 0.f : mn;  // a column that has seen no key yet
    alpha[ci] = att_exp2(m[ci] - mu);
    m[ci] = mn;
    float& p0 = s[4 * (ci >> 1) + (ci & 1)];
    float& p1 = s[4 * (ci >> 1) + 2 + (ci & 1)];
    p0 = att_exp2(p0 - mu);
    p1 = att_exp2(p1 - mu);
    l[ci] = l[ci] * alpha[ci] + (p0 + p1);
  }
  rows_n_store_p<NJ>(s, w.sP, w.r0, FUSED_BM, w.wq, 4 * w.gid + w.tig);  // P, K-major
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < NW / 2; ++e) o[i * OS + e] *= alpha[2 * (e >> 2) + (e & 1)];
  att_fence_proxy_async();  // P, visible to wgmma
  rn_bar(w.bar);            // the warpgroup's P rows are all in smem

  // O^T += V^T P^T: value block i (64 latent columns of the KV tile, read MN-major: 8-token
  // groups 1024 B apart) times P's 16-token k-step t (32 bytes at 32 t).
  wg_pin<8 * OS>(o);
  wg_fence();
#pragma unroll
  for (int i = 0; i < ATT_D_V / 64; ++i)
#pragma unroll
    for (int t = 0; t < FUSED_BN / 16; ++t)
      wg_mma<NW, 1>(o + i * OS, wg_desc(kb + i * (FUSED_BN * 128) + t * 16 * 128, FUSED_BN * 128, 1024),
                    wg_desc(pb + 32 * t, 16, 1024));
  wg_commit();
  wg_wait_all();
  wg_pin<8 * OS>(o);
}

// The end: column sums over the 64 token lanes, then out / lse (or the split's partials) of
// the warpgroup's real rows. The caller has synchronised the block (red is free).
template <int NW, int OS>
__device__ __forceinline__ void rn_finish(const float* o, const float* m, float* l, const RnWarpgroup& w,
                                          const FusedBlock& k, int rows, att_bf16* out, float* lse,
                                          att_bf16* o_part, float* lse_part, int B, int slot0) {
#pragma unroll
  for (int ci = 0; ci < NW / 4; ++ci) {
#pragma unroll
    for (int off = 4; off <= 16; off <<= 1) l[ci] += __shfl_xor_sync(0xffffffffu, l[ci], off);
    if (w.gid == 0) w.red[w.wq * RN_WG_ROWS + 8 * (ci >> 1) + 2 * w.tig + (ci & 1)] = l[ci];
  }
  rn_bar(w.bar);
  float inv[NW / 4];
#pragma unroll
  for (int ci = 0; ci < NW / 4; ++ci) {
    const int col = 8 * (ci >> 1) + 2 * w.tig + (ci & 1), r = w.r0 + col;
    const float sum = (w.red[col] + w.red[RN_WG_ROWS + col]) + (w.red[2 * RN_WG_ROWS + col] + w.red[3 * RN_WG_ROWS + col]);
    inv[ci] = sum > 0.f ? 1.f / sum : 0.f;
    if (w.wq == 0 && w.gid == 0 && r < rows)
      fused_write_lse(lse, lse_part, o_part != nullptr, k, B, slot0, r, m[ci], sum);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < NW / 2; ++e) {
      const int ci = 2 * (e >> 2) + (e & 1), r = w.r0 + 8 * (e >> 2) + 2 * w.tig + (e & 1);
      if (r >= rows) continue;
      const int v = 64 * i + 16 * w.wq + w.gid + 8 * ((e >> 1) & 1);
      const size_t g = (size_t)k.b * k.NH + k.g0 + r;
      unsigned short h;
      asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(o[i * OS + e] * inv[ci]));
      if (o_part != nullptr)
        o_part[((size_t)(slot0 + k.split) * B * k.NH + g) * ATT_D_V + v] = h;
      else
        out[g * ATT_D_V + v] = h;
    }
  }
}

// The kernel of blocks whose warpgroup 0 owns NW rows; warpgroup 1 owns NW or NW - 8 (tile rows
// 2 NW or 2 NW - 8), so each kernel carries two accumulator shapes, not four.
template <int NW>
__device__ __forceinline__ void rn_kernel(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                                          const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                                          att_bf16* __restrict__ out, float* __restrict__ lse,
                                          att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B, int S,
                                          int N, int H, int W, int splits, int slot0, int mode, int tile_rows,
                                          float scale_log2) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = fused_smem_base(smem_raw);
  const att_u32 sQ = att_smem_addr(smem);
  const att_u32 sKV = sQ + FUSED_SMEM_Q;
  float* red = reinterpret_cast<float*>(smem + FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode, tile_rows);
  // Every block computes the full tile (a short last tile is padded, so the warpgroups' shapes
  // stay NW and NW or NW - 8); rows is how many of them are real.
  const int tile = min(tile_rows, 2 * NW), rows = min(tile, k.NH - k.g0);
  const int groups = tile >> 3, first = (groups + 1) >> 1;  // 8-row groups; warpgroup 0's
  const int nw = 8 * (wg ? groups - first : first);
  const RnWarpgroup w{sQ, sKV + 2 * FUSED_SMEM_KV, red + wg * 4 * RN_WG_ROWS, wg ? 8 * first : 0,
                      warp & 3, lane >> 2, lane & 3, 1 + wg};
  const att_bf16* kvb = kv + (size_t)k.b * S * ATT_D_QK;

  float o[4 * NW], m[NW / 4], l[NW / 4];
#pragma unroll
  for (int i = 0; i < 4 * NW; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < NW / 4; ++i) {
    m[i] = ATT_NEG_INF;
    l[i] = 0.f;
  }

  fused_load_first(sQ, sKV, q, kvb, k, rows, tid);
  for (int kt = k.kt0; kt < k.kt1; ++kt) {
    // tile kt landed; every warp is done with tile kt - 1 and with red
    const att_u32 sK = fused_next_tile<true>(sKV, kvb, k, kt, tid);
    const int T = k.lo + kt * FUSED_BN;
    if (nw == NW) {
      rn_tile<NW, NW / 2>(o, m, l, sK, w, k, vis, N, H, W, T, scale_log2);
    } else if constexpr (NW > 8) {
      if (nw == NW - 8) rn_tile<NW - 8, NW / 2>(o, m, l, sK, w, k, vis, N, H, W, T, scale_log2);
    }
  }
  __syncthreads();  // every warp is past its last read of red
  if (nw == NW) {
    rn_finish<NW, NW / 2>(o, m, l, w, k, rows, out, lse, o_part, lse_part, B, slot0);
  } else if constexpr (NW > 8) {
    if (nw == NW - 8) rn_finish<NW - 8, NW / 2>(o, m, l, w, k, rows, out, lse, o_part, lse_part, B, slot0);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// verify_fused_rows_n<NW>: blocks of 2 NW - 8 or 2 NW rows (NW = 8: 8 or 16).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RN_BODY(NW) \
  rn_kernel<NW>(q, kv, prefix_lens, vis, out, lse, o_part, lse_part, B, S, N, H, W, splits, slot0, mode, tile_rows, \
                scale_log2)
#else
#define RN_BODY(NW)
#endif
#define RN_ENTRY(NW)                                                                                           \
  extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 1) verify_fused_rows_n##NW(                       \
      const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv, const int* __restrict__ prefix_lens,     \
      const long long* __restrict__ vis, att_bf16* __restrict__ out, float* __restrict__ lse,                   \
      att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, \
      int slot0, int mode, int tile_rows, float scale_log2) {                                                  \
    RN_BODY(NW);                                                                                               \
  }
RN_ENTRY(8)
RN_ENTRY(16)
RN_ENTRY(24)
RN_ENTRY(32)
