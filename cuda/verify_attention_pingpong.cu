// verify_fused on wgmma (sm_90a), v5: the two warpgroups take alternate KV tiles for S = Q K^T at
// the full tile width, and hand P and the row rescale to each other through shared memory with
// named barriers instead of block-wide ones. Same function, block shape (64 rows x 64 KV rows),
// Q / KV tile layout, split/partial protocol and combine as verify_fused_wgmma
// (cuda/verify_attention_wgmma.cu); built with nvcc for sm_90a, empty elsewhere.
//
// Tile i of the block's split (i = kt - kt0) lives in KV stage i & 1 and is owned by warpgroup
// i & 1, which computes S of all 64 rows x 64 KV columns with 36 wgmma m64n64k16 (the v4 kernel
// split every tile's S between both warpgroups, 72 m64n32k16 per tile), the masked online
// softmax of the whole row (no cross-warpgroup max), the running row max (sM) and the row
// rescale (sAlpha), and writes P. Both warpgroups then accumulate O += P V over their own 256
// value columns (4 wgmma m64n256k16 each), the non-owner first rescaling its O rows by sAlpha.
// Each warpgroup keeps a partial row sum over its own tiles, rescaled by every tile's alpha; the
// two partials meet at the end.
//
// Loads: warpgroup h loads value half h (column blocks 4 h .. 4 h + 3, and the rope block 8 of
// the tiles it owns) of tile i + 2 into stage i & 1 as soon as its own reads of tile i are done
// (after its O += P V of tile i), with cp.async completing on an mbarrier per (stage, half)
// (cp.async.mbarrier.arrive.noinc: the loading threads never wait). The owner of a tile waits on
// both halves' mbarriers before its S.
//
// Handoffs (named barriers of 256 threads, one warpgroup arriving and the other waiting; one
// barrier per direction, so that a warpgroup never arrives twice at a barrier before the other
// has waited on it: with a single barrier for both directions, a warpgroup that published tile i
// and reached its wait for tile i + 1 first completed the barrier on its own and hung):
//   PP_NB_PUB + w:  warpgroup w, owner of tile i, has written P(i), sAlpha and sM (fenced for the
//                   async proxy);
//   PP_NB_FREE + w: warpgroup w has finished its O += P V of its tile i (P is single-buffered);
//   PP_NB_WG + h (128 threads): warpgroup h's own P stores are complete before its own O += P V.
#include "attention_common.cuh"
#include "attention_pingpong.cuh"
#include "attention_tile.cuh"
#include "attention_wgmma.cuh"

#define PP_NB_PUB 1   // + owner warpgroup
#define PP_NB_FREE 3  // + owner warpgroup
#define PP_NB_WG 5    // + warpgroup

// Shared memory: Q, two KV stages, one P tile, then fp32 rows sM [BM], sAlpha [BM], sRed [2][BM],
// then four mbarriers (stage x half). FUSED_SMEM_BYTES has room for all of it.
#define PP_SMEM_STATS (4 * FUSED_BM * 4)
#define PP_SMEM_BYTES (FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P + PP_SMEM_STATS + 4 * 8 + 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Warpgroup-thread wtid's share of value half h (and with `rope`, the rope block) of KV rows
// [t0, t0 + 64) into a stage; rows at or past `valid` are zero-filled. Arrives on `bar` when it
// has landed.
__device__ __forceinline__ void pp_load_half(att_u32 stage, const att_bf16* __restrict__ kvb, int t0, int valid,
                                             int h, bool rope, int wtid, att_u32 bar) {
#pragma unroll
  for (int k = 0; k < 4 * FUSED_BN * 8 / 128; ++k) {  // 4 column blocks x 64 rows x 8 chunks
    const int i = wtid + 128 * k;
    const int r = (i >> 3) & (FUSED_BN - 1), cg = 8 * (4 * h + (i >> 9)) + (i & 7);
    const bool ok = r < valid;
    att_cp_async16(stage + fused_off(r, cg, FUSED_BN), kvb + (size_t)(ok ? t0 + r : t0) * ATT_D_QK + cg * 8,
                   ok ? 16 : 0);
  }
  if (rope) {
#pragma unroll
    for (int k = 0; k < FUSED_BN * 8 / 128; ++k) {
      const int i = wtid + 128 * k;
      const int r = i >> 3, cg = 64 + (i & 7);
      const bool ok = r < valid;
      att_cp_async16(stage + fused_off(r, cg, FUSED_BN), kvb + (size_t)(ok ? t0 + r : t0) * ATT_D_QK + cg * 8,
                     ok ? 16 : 0);
    }
  }
  att_cp_async_commit();
  mb_arrive_cp_async(bar);
}

// Issue S = Q K^T of tile i (stage i & 1) into s, once both halves of the tile have landed: 36
// wgmma m64n64k16, k-step ks reading 32 bytes at 32 (ks % 4) of column block ks / 4 of Q and K.
// One wgmma group, not waited for.
__device__ __forceinline__ void pp_qk(float (&s)[8][4], att_u32 sQ, att_u32 sKV, att_u32 sBar, int i) {
  const int st = i & 1, par = (i >> 1) & 1;
  const att_u32 sK = sKV + st * FUSED_SMEM_KV;
  mb_wait(sBar + 8 * (2 * st), par);
  mb_wait(sBar + 8 * (2 * st + 1), par);
  att_fence_proxy_async();
  pp_issue_s(s, sQ, sK);
}


template <bool EARLY>
__device__ __forceinline__ void pp_body(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                      const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                      att_bf16* __restrict__ out, float* __restrict__ lse, float* __restrict__ o_part,
                      float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, int slot0,
                      int mode, float scale_log2) {
  static_assert(FUSED_BM == 64 && FUSED_BN == 64 && FUSED_THREADS == 256 && ATT_D_V == 2 * 256 && ATT_D_QK == 576,
                "verify_fused_pingpong: 2 warpgroups, 64 x 64 tiles, 256 value columns each, 9 column blocks");
  static_assert(PP_SMEM_BYTES <= 232448, "shared memory");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const PpSmem m = pp_smem(smem_raw);  // mbarriers from m.sBar: [stage][half]
  float *sM = m.sM, *sAlpha = m.sAlpha, *sRed = m.sRed;
  const att_u32 sQ = m.sQ, sKV = m.sKV, sP = m.sP, sBar = m.sBar;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int wg = warp >> 2, wtid = tid & 127;
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode);
  const att_bf16* kvb = kv + (size_t)k.b * S * ATT_D_QK;
  const int n = k.kt1 - k.kt0;  // tiles of this split

  const int r_lo = 16 * (warp & 3) + gid, r_hi = r_lo + 8;
  const long long* v_lo = fused_vis_row(vis, k, N, H, W, r_lo);
  const long long* v_hi = fused_vis_row(vis, k, N, H, W, r_hi);

  if (tid < 4) mb_init(sBar + 8 * tid, 128);
  if (tid < FUSED_BM) sM[tid] = ATT_NEG_INF;
  __syncthreads();  // barriers initialised before any arrival
  if (n > 0) {
    fused_load_rows<FUSED_BM>(sQ, q + ((size_t)k.b * k.NH + k.g0) * ATT_D_QK, k.NH - k.g0, tid);
    att_cp_async_commit();
    for (int i = 0; i < 2 && i < n; ++i) {
      const int t0 = k.lo + (k.kt0 + i) * FUSED_BN;
      pp_load_half(sKV + i * FUSED_SMEM_KV, kvb, t0, k.hi - t0, wg, wg == i, wtid, sBar + 8 * (2 * i + wg));
    }
    if (n > 1)  // Q landed (the first tiles' groups may still be in flight)
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    else
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    att_fence_proxy_async();
  }
  __syncthreads();  // Q visible to every warp

  float o[128];  // O rows r_lo (o[4 j], o[4 j + 1]) / r_hi (o[4 j + 2], o[4 j + 3]), columns 256 wg + 8 j + 2 tig
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float l_lo = 0.f, l_hi = 0.f;
  const att_u64 dP = wg_desc(sP, 16, 1024);

  // S of the warpgroup's next own tile: warpgroup-thread accumulators of wgmma m64n64 (n8 tile nt:
  // rows r_lo / r_hi, KV columns 8 nt + 2 tig + {0, 1}).
  float s[8][4];
  for (int i = 0; i < n; ++i) {
    const int st = i & 1, par = (i >> 1) & 1;
    const att_u32 sK = sKV + st * FUSED_SMEM_KV;
    float al_lo, al_hi;
    if (st == wg) {
      if (!EARLY || i == 0) pp_qk(s, sQ, sKV, sBar, i);
      wg_wait_all();
      wg_pin<32>(&s[0][0]);

      float mx_lo, mx_hi;
      fused_scale_mask_max(s, k, k.lo + (k.kt0 + i) * FUSED_BN, 0, tig, v_lo, v_hi, W, scale_log2, mx_lo, mx_hi);
      if (i > 0) nb_sync(PP_NB_FREE + 1 - wg, 256);  // the other warpgroup is done reading P(i - 1)
      pp_owner_softmax(s, mx_lo, mx_hi, l_lo, l_hi, al_lo, al_hi, sM, sAlpha, sP, r_lo, r_hi, tig);
      nb_arrive(PP_NB_PUB + wg, 256);
      nb_sync(PP_NB_WG + wg, 128);  // this warpgroup's part of P is all written
    } else {
      // EARLY: S of the next tile (this warpgroup's) runs while the owner of tile i finishes it.
      if (EARLY && i + 1 < n) pp_qk(s, sQ, sKV, sBar, i + 1);
      nb_sync(PP_NB_PUB + st, 256);  // P(i), sAlpha, sM of tile i published by its owner
      mb_wait(sBar + 8 * (2 * st + wg), par);
      att_fence_proxy_async();
      al_lo = sAlpha[r_lo];
      al_hi = sAlpha[r_hi];
      l_lo *= al_lo;
      l_hi *= al_hi;
    }
    pp_pv(o, al_lo, al_hi, dP, sK, wg);  // (EARLY: waits for the next tile's S as well)
    if (EARLY) wg_pin<32>(&s[0][0]);
    if (st == wg && i + 1 < n) nb_arrive(PP_NB_FREE + wg, 256);  // P(i) may be overwritten
    if (i + 2 < n) {  // this warpgroup is done with its half of stage st: tile i + 2 goes there
      const int t0 = k.lo + (k.kt0 + i + 2) * FUSED_BN;
      pp_load_half(sK, kvb, t0, k.hi - t0, wg, st == wg, wtid, sBar + 8 * (2 * st + wg));
    }
  }

  pp_row_sums(l_lo, l_hi, sRed, wg, r_lo, r_hi, tig);
  __syncthreads();  // both partial sums and the final sM

  fused_store_o_half(o, out, o_part, k, B, slot0, r_lo, wg, tig, sRed);
  fused_store_lse(lse, lse_part, o_part != nullptr, k, B, slot0, sRed, sM, tid);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// EARLY = true (verify_fused_pingpong): a warpgroup issues S of its next tile before the O += P V
// of the other warpgroup's tile, so one warpgroup's softmax runs while the other's S is on the
// tensor cores. EARLY = false (verify_fused_pingpong_seq): S of a tile only after the previous
// tile's O += P V (no overlap; the next tile's loads have a whole tile to land).
#define PP_ENTRY(NAME, EARLY)                                                                                   \
  extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 1)                                               \
      NAME(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv, const int* __restrict__ prefix_lens, \
           const long long* __restrict__ vis, att_bf16* __restrict__ out, float* __restrict__ lse,               \
           float* __restrict__ o_part, float* __restrict__ lse_part, int B, int S, int N, int H, int W,          \
           int splits, int slot0, int mode, float scale_log2) {                                                 \
    PP_BODY(EARLY)                                                                                              \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PP_BODY(EARLY) \
  pp_body<EARLY>(q, kv, prefix_lens, vis, out, lse, o_part, lse_part, B, S, N, H, W, splits, slot0, mode, scale_log2);
#else
#define PP_BODY(EARLY)
#endif
PP_ENTRY(verify_fused_pingpong, true)
PP_ENTRY(verify_fused_pingpong_seq, false)
