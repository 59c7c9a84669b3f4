// The alternate-tile ping-pong of two consumer warpgroups in the TMA kernels
// (verify_attention_tma.cu; wgmma_probe.cu times its two wgmma steps). Tile i of a split is owned by
// warpgroup i & 1, which computes S of all 64 rows x 64 KV columns, the masked online softmax of
// whole rows, and publishes P (one shared tile), the running row max sM and the row rescale
// sAlpha; both warpgroups then accumulate O += P V over their own 256 value columns. These are
// the steps between the kernels' handoffs; sm_90a only.
#ifndef KDTREE_ATTENTION_PINGPONG_CUH
#define KDTREE_ATTENTION_PINGPONG_CUH

#include "attention_tile.cuh"
#include "attention_trace.cuh"
#include "attention_wgmma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The ping-pong kernels' shared memory: Q, two KV stages, one P tile, fp32 rows sM [BM], sAlpha
// [BM], sRed [2][BM], then the kernel's mbarriers (8 bytes each) from sBar on.
struct PpSmem {
  float *sM, *sAlpha, *sRed;
  att_u32 sQ, sKV, sP, sBar;
};
__device__ __forceinline__ PpSmem pp_smem(unsigned char* smem_raw) {
  unsigned char* smem = fused_smem_base(smem_raw);
  PpSmem m;
  m.sM = reinterpret_cast<float*>(smem + FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P);
  m.sAlpha = m.sM + FUSED_BM;
  m.sRed = m.sAlpha + FUSED_BM;
  m.sQ = att_smem_addr(smem);
  m.sKV = m.sQ + FUSED_SMEM_Q;
  m.sP = m.sKV + 2 * FUSED_SMEM_KV;
  m.sBar = att_smem_addr(m.sRed + 2 * FUSED_BM);
  return m;
}

// The consumer warpgroups' start in the TMA kernels (256 threads, tid < 256): the block's Q rows
// (rows past N H zero-filled) by cp.async, fenced for wgmma and visible to both warpgroups after
// named barrier `nb`; O zeroed.
__device__ __forceinline__ void pp_consumers_start(float (&o)[128], att_u32 sQ, const att_bf16* __restrict__ q,
                                                   const FusedBlock& k, int n, int tid, int nb) {
  if (n > 0) {
    fused_load_rows<FUSED_BM>(sQ, q + ((size_t)k.b * k.NH + k.g0) * ATT_D_QK, k.NH - k.g0, tid);
    att_cp_async_commit();
    att_cp_async_wait_all();
    att_fence_proxy_async();
  }
  nb_sync(nb, 256);  // Q visible to both consumer warpgroups
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
}

// The owner's new running max and row rescale of rows r_lo / r_hi into sM / sAlpha, by each quad's
// tig-0 thread once the quad's reads of sM are done.
__device__ __forceinline__ void pp_publish_stats(float* sM, float* sAlpha, float m_lo, float m_hi, float al_lo,
                                                 float al_hi, int r_lo, int r_hi, int tig) {
  __syncwarp();  // the quad's reads of sM are done before its tig-0 thread writes it
  if (tig == 0) {
    sM[r_lo] = m_lo;
    sM[r_hi] = m_hi;
    sAlpha[r_lo] = al_lo;
    sAlpha[r_hi] = al_hi;
  }
}

// Zero rows [valid, BN) of the KV tile at sK (the TMA kernels' partial last tile: rows past the KV
// range end are real memory, possibly not finite, and V rows multiply P = 0) by the 128 threads of
// one warpgroup, fenced for the async proxy, then synchronised on the warpgroup's mbarrier `zero`
// (128 arrivals; one phase per block: a split has one last tile).
__device__ __forceinline__ void pp_zero_tail_rows(att_u32 sK, int valid, int wtid, att_u32 zero) {
  for (int c = wtid; c < (FUSED_BN - valid) * QK_CHUNKS; c += 128) {
    const int r = valid + c / QK_CHUNKS, cg = c % QK_CHUNKS;
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(sK + fused_off(r, cg, FUSED_BN)), "r"(0)
                 : "memory");
  }
  att_fence_proxy_async();
  mb_arrive(zero);
  mb_wait(zero, 0);
}

// The first KS k-steps of S = Q K^T of the tile in stage sK into s, zeroed first (wgmma m64n64
// accumulators: n8 tile nt holds rows r_lo / r_hi, KV columns 8 nt + 2 tig + {0, 1}): wgmma
// m64n64k16 with both operands in shared memory, k-step ks reading 32 bytes at 32 (ks % 4) of
// column block ks / 4 of Q and K. Neither committed nor waited for.
template <int KS>
__device__ __forceinline__ void pp_s_steps(float (&s)[8][4], att_u32 sQ, att_u32 sK) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
  wg_pin<32>(&s[0][0]);
  wg_fence();
  const att_u64 dQ = wg_desc(sQ, 16, 1024), dK = wg_desc(sK, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const att_u32 off = (ks >> 2) * 128 * FUSED_BN + (ks & 3) * 32;
    wg_mma<64, 0>(&s[0][0], wg_desc_add(dQ, off), wg_desc_add(dK, off));
  }
}

// Issue S = Q K^T of the tile in stage sK into s: all 36 k-steps (pp_s_steps) as one wgmma group,
// not waited for.
__device__ __forceinline__ void pp_issue_s(float (&s)[8][4], att_u32 sQ, att_u32 sK) {
  pp_s_steps<ATT_D_QK / 16>(s, sQ, sK);
  wg_commit();
}

// The owner's softmax of its tile (row maxima mx_lo / mx_hi over the tile), once the previous
// tile's P and sAlpha are free: the running max from sM (published with the previous tile), P
// into the P tile, the new sM and sAlpha (by the quad's tig-0 thread), P fenced for wgmma. Returns
// the rows' rescale factors in al_lo / al_hi.
__device__ __forceinline__ void pp_owner_softmax(float (&s)[8][4], float mx_lo, float mx_hi, float& l_lo,
                                                 float& l_hi, float& al_lo, float& al_hi, float* sM, float* sAlpha,
                                                 att_u32 sP, int r_lo, int r_hi, int tig) {
  float m_lo = sM[r_lo], m_hi = sM[r_hi];
  fused_softmax_store_p(s, mx_lo, mx_hi, m_lo, m_hi, l_lo, l_hi, al_lo, al_hi, sP, r_lo, r_hi, 0, tig);
  pp_publish_stats(sM, sAlpha, m_lo, m_hi, al_lo, al_hi, r_lo, r_hi, tig);
  att_fence_proxy_async();  // P, visible to wgmma
}

// Issue O += P V over value columns 256 wg .. as one wgmma group, not waited for (pp_pv_steps; after
// rescaling O by the tile's factors: pp_issue_pv): k-step t takes P columns 16 t .. and V rows (tokens) 16 t ..; V's 256
// columns are 4 column blocks 8 KB apart (LBO), its 8-token groups 1024 B apart (SBO).
__device__ __forceinline__ void pp_pv_steps(float (&o)[128], att_u64 dP, att_u32 sK, int wg) {
  wg_fence();
  const att_u64 dV = wg_desc(sK + 4 * wg * FUSED_BN * 128, FUSED_BN * 128, 1024);
#pragma unroll
  for (int t = 0; t < FUSED_BN / 16; ++t) wg_m64n256k16_tb(o, dP + 2 * t, wg_desc_add(dV, 16 * t * 128));
  wg_commit();
}
__device__ __forceinline__ void pp_issue_pv(float (&o)[128], float al_lo, float al_hi, att_u64 dP, att_u32 sK,
                                            int wg) {
  fused_rescale_o(o, al_lo, al_hi);
  wg_pin<128>(o);
  pp_pv_steps(o, dP, sK, wg);
}


// A warpgroup's partial row sums, reduced over the quad, into sRed [wg][BM]; the caller syncs both
// warpgroups before fused_store_o_half / fused_store_lse read them.
__device__ __forceinline__ void pp_row_sums(float l_lo, float l_hi, float* sRed, int wg, int r_lo, int r_hi,
                                            int tig) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  if (tig == 0) {
    sRed[wg * FUSED_BM + r_lo] = l_lo;
    sRed[wg * FUSED_BM + r_hi] = l_hi;
  }
}

// The consumer warpgroups' end in the TMA kernels: both warpgroups' row sums into sRed, named
// barrier `nb` (256 threads: the sums and the final sM visible), then O and lse stored. The trace
// records the barrier passed and O's stores issued.
__device__ __forceinline__ void pp_consumers_end(const float (&o)[128], float l_lo, float l_hi, att_bf16* out,
                                                 float* lse, att_bf16* o_part, float* lse_part, const FusedBlock& k,
                                                 int B, int slot0, float* sRed, const float* sM, int wg, int r_lo,
                                                 int r_hi, int tig, int tid, int nb, AttTrace& tr) {
  pp_row_sums(l_lo, l_hi, sRed, wg, r_lo, r_hi, tig);
  nb_sync(nb, 256);  // both partial sums and the final sM
  att_trace_rec(tr, ATT_EV_EPI_SYNC, -1);
  fused_store_o_half(o, out, o_part, k, B, slot0, r_lo, wg, tig, sRed);
  att_trace_rec(tr, ATT_EV_O_STORED, -1);
  fused_store_lse(lse, lse_part, o_part != nullptr, k, B, slot0, sRed, sM, tid);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
#endif  // KDTREE_ATTENTION_PINGPONG_CUH
