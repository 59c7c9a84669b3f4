// verify_fused on wgmma (sm_90a): the same function, block shape, shared-memory layout and
// split/partial protocol as verify_fused in verify_attention.cu (see there for the contract);
// built with nvcc for sm_90a (kdtree.kernels, compiler="nvcc"). For other targets (the sm_90
// compile check, NVRTC) the kernel body is empty and Python never launches it.
//
// Two warpgroups. S = Q K^T: warpgroup g computes all 64 rows x KV columns 32 g .. +31 with
// 36 wgmma m64n32k16 reading Q and K straight from shared memory. O += P V: warpgroup g owns
// value columns 256 g .. +255 (128 fp32 accumulators per thread) and runs 4 wgmma m64n256k16
// with P (K-major) and V (the same KV tile, read MN-major: transposed) from shared memory.
// In both, warp w of a warpgroup holds rows 16 w .. +15, so each thread owns the same two rows
// in S and O and rescales its O rows with its own alpha. Row maxima and sums of the two column
// halves meet in shared memory.
#include "attention_common.cuh"
#include "attention_tile.cuh"
#include "attention_wgmma.cuh"

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 1)
verify_fused_wgmma(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                   const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                   att_bf16* __restrict__ out, float* __restrict__ lse, att_bf16* __restrict__ o_part,
                   float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, int slot0,
                   int mode, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(FUSED_BM == 64 && FUSED_BN == 64 && FUSED_THREADS == 256 && ATT_D_V == 2 * 256,
                "verify_fused_wgmma: 2 warpgroups, 64 x 64 tiles, 256 value columns each");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = fused_smem_base(smem_raw);
  float* sRed = reinterpret_cast<float*>(smem + FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P);
  float* sMax = sRed + 2 * FUSED_BM;
  const att_u32 sQ = att_smem_addr(smem);
  const att_u32 sKV = sQ + FUSED_SMEM_Q;
  const att_u32 sP = sKV + 2 * FUSED_SMEM_KV;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int wg = warp >> 2;  // warpgroup: S columns 32 wg .., O columns 256 wg ..
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode);
  const att_bf16* kvb = kv + (size_t)k.b * S * ATT_D_QK;

  const int r_lo = 16 * (warp & 3) + gid, r_hi = r_lo + 8;
  const FusedRows vr = fused_rows(vis, k, N, H, W, r_lo);

  float o[128];  // O rows r_lo (o[4 j], o[4 j + 1]) / r_hi (o[4 j + 2], o[4 j + 3]), columns 256 wg + 8 j + 2 tig
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = ATT_NEG_INF, m_hi = ATT_NEG_INF, l_lo = 0.f, l_hi = 0.f;

  fused_load_first(sQ, sKV, q, kvb, k, k.NH - k.g0, tid);

  for (int kt = k.kt0; kt < k.kt1; ++kt) {
    // tile kt landed; every warp is done with tile kt - 1
    const att_u32 sK = fused_next_tile<true>(sKV, kvb, k, kt, tid);

    // S = Q K^T, rows 0..63 x KV columns 32 wg .. +31. k-step ks reads 32 bytes at offset
    // 32 (ks % 4) of column block ks / 4 of Q and of K rows 32 wg ..; 8-row groups 1024 B apart.
    float s[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
    wg_pin<16>(&s[0][0]);  // accumulator writes stay before the fence
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < ATT_D_QK / 16; ++ks) {
      const att_u32 blk = (ks >> 2) * 128, kk = (ks & 3) * 32;
      wg_mma<32, 0>(&s[0][0], wg_desc(sQ + blk * FUSED_BM + kk, 16, 1024),
                   wg_desc(sK + blk * FUSED_BN + 32 * wg * 128 + kk, 16, 1024));
    }
    wg_commit();
    wg_wait_all();
    wg_pin<16>(&s[0][0]);

    float mx_lo, mx_hi;
    fused_scale_mask_max(s, k, k.lo + kt * FUSED_BN, 32 * wg, tig, vr, W, scale_log2, mx_lo, mx_hi);
    if (tig == 0) {
      sRed[wg * FUSED_BM + r_lo] = mx_lo;
      sRed[wg * FUSED_BM + r_hi] = mx_hi;
    }
    __syncthreads();  // both halves' row maxima are in sRed

    float al_lo, al_hi;
    fused_softmax_store_p(s, fmaxf(sRed[r_lo], sRed[FUSED_BM + r_lo]), fmaxf(sRed[r_hi], sRed[FUSED_BM + r_hi]),
                          m_lo, m_hi, l_lo, l_hi, al_lo, al_hi, sP, r_lo, r_hi, wg, tig);
    fused_rescale_o(o, al_lo, al_hi);
    att_fence_proxy_async();  // P, visible to wgmma
    __syncthreads();          // all of P is in smem

    // O += P V: k-step t takes P columns 16 t .. (32 bytes at 32 t) and V rows (tokens)
    // 16 t .. (2048 B at 2048 t); V's 256 columns are 4 column blocks 8 KB apart (LBO), its
    // 8-token groups 1024 B apart (SBO).
    wg_pin<128>(o);
    wg_fence();
#pragma unroll
    for (int t = 0; t < FUSED_BN / 16; ++t)
      wg_m64n256k16_tb(o, wg_desc(sP + 32 * t, 16, 1024),
                       wg_desc(sK + 4 * wg * FUSED_BN * 128 + 16 * t * 128, FUSED_BN * 128, 1024));
    wg_commit();
    wg_wait_all();
    wg_pin<128>(o);
  }

  // Row sums: reduce over the quad, then over the two column halves through smem.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  __syncthreads();  // every warp is past its last read of sRed
  if (tig == 0) {
    sRed[wg * FUSED_BM + r_lo] = l_lo;
    sRed[wg * FUSED_BM + r_hi] = l_hi;
    if (wg == 0) {
      sMax[r_lo] = m_lo;
      sMax[r_hi] = m_hi;
    }
  }
  __syncthreads();

  fused_store_o_half(o, out, o_part, k, B, slot0, r_lo, wg, tig, sRed);
  fused_store_lse(lse, lse_part, o_part != nullptr, k, B, slot0, sRed, sMax, tid);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}
