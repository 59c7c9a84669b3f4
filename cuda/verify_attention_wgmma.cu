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

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor: start address, leading / stride byte offsets, 128B swizzle.
__device__ __forceinline__ att_u64 wg_desc(att_u32 addr, att_u32 lbo, att_u32 sbo) {
  return (att_u64)((addr & 0x3FFFF) >> 4) | ((att_u64)((lbo >> 4) & 0x3FFF) << 16) |
         ((att_u64)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keeps the compiler from touching accumulator registers across wgmma.wait / wgmma.fence.
template <int COUNT>
__device__ __forceinline__ void wg_pin(float* r) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D[64 x 32] += A[64 x 16] B[32 x 16]^T, A and B K-major in shared memory.
__device__ __forceinline__ void wg_m64n32k16(float* d, att_u64 da, att_u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(1));
}

// D[64 x 256] += A[64 x 16] B[16 x 256], A K-major and B MN-major (transposed) in shared memory.
__device__ __forceinline__ void wg_m64n256k16_tb(float* d, att_u64 da, att_u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 1)
verify_fused_wgmma(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                   const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                   att_bf16* __restrict__ out, float* __restrict__ lse, float* __restrict__ o_part,
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
  const long long* v_lo = fused_vis_row(vis, k, N, H, W, r_lo);
  const long long* v_hi = fused_vis_row(vis, k, N, H, W, r_hi);

  float o[128];  // O rows r_lo (o[4 j], o[4 j + 1]) / r_hi (o[4 j + 2], o[4 j + 3]), columns 256 wg + 8 j + 2 tig
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_lo = ATT_NEG_INF, m_hi = ATT_NEG_INF, l_lo = 0.f, l_hi = 0.f;

  if (k.kt0 < k.kt1) {
    fused_load_rows<FUSED_BM>(sQ, q + ((size_t)k.b * k.NH + k.g0) * ATT_D_QK, k.NH - k.g0, tid);
    const int t0 = k.lo + k.kt0 * FUSED_BN;
    fused_load_rows<FUSED_BN>(sKV, kvb + (size_t)t0 * ATT_D_QK, k.hi - t0, tid);
    att_cp_async_commit();
  }

  for (int kt = k.kt0; kt < k.kt1; ++kt) {
    const att_u32 sK = sKV + ((kt - k.kt0) & 1) * FUSED_SMEM_KV;
    att_cp_async_wait_all();
    att_fence_proxy_async();  // the tile's cp.async writes, visible to wgmma
    __syncthreads();          // tile kt landed; both warpgroups are done with tile kt - 1
    if (kt + 1 < k.kt1) {
      const int t1 = k.lo + (kt + 1) * FUSED_BN;
      fused_load_rows<FUSED_BN>(sKV + ((kt + 1 - k.kt0) & 1) * FUSED_SMEM_KV, kvb + (size_t)t1 * ATT_D_QK,
                                k.hi - t1, tid);
      att_cp_async_commit();
    }

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
      wg_m64n32k16(&s[0][0], wg_desc(sQ + blk * FUSED_BM + kk, 16, 1024),
                   wg_desc(sK + blk * FUSED_BN + 32 * wg * 128 + kk, 16, 1024));
    }
    wg_commit();
    wg_wait_all();
    wg_pin<16>(&s[0][0]);

    float mx_lo, mx_hi;
    fused_scale_mask_max(s, k, k.lo + kt * FUSED_BN, 32 * wg, tig, v_lo, v_hi, scale_log2, mx_lo, mx_hi);
    if (tig == 0) {
      sRed[wg * FUSED_BM + r_lo] = mx_lo;
      sRed[wg * FUSED_BM + r_hi] = mx_hi;
    }
    __syncthreads();  // both halves' row maxima are in sRed

    float al_lo, al_hi;
    fused_softmax_store_p(s, fmaxf(sRed[r_lo], sRed[FUSED_BM + r_lo]), fmaxf(sRed[r_hi], sRed[FUSED_BM + r_hi]),
                          m_lo, m_hi, l_lo, l_hi, al_lo, al_hi, sP, r_lo, r_hi, wg, tig);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= al_lo;
      o[4 * j + 1] *= al_lo;
      o[4 * j + 2] *= al_hi;
      o[4 * j + 3] *= al_hi;
    }
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

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r_lo + 8 * half;
    if (k.g0 + r >= k.NH) continue;
    const float l = sRed[r] + sRed[FUSED_BM + r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      fused_store_pair(out, o_part, k, B, slot0, r, 256 * wg + 8 * j + 2 * tig, o[4 * j + 2 * half] * inv,
                       o[4 * j + 2 * half + 1] * inv);
  }
  fused_store_lse(lse, lse_part, o_part != nullptr, k, B, slot0, sRed, sMax, tid);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}
