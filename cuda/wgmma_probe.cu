// Tensor-core rate of the verify kernels' two wgmma steps in isolation (sm_90a, nvcc): S = Q K^T
// exactly as the ping-pong kernels issue it (pp_issue_s: 36 m64n64k16, Q and K both read from
// shared memory) and O += P V (pp_issue_pv: 4 m64n256k16 over one warpgroup's 256 value columns,
// P and V from shared memory; the O rescale is skipped, its factors being 1 as past a split's first tiles), each issued and waited for `iters` times in a row
// on one resident tile, one block per SM. No loads, no softmax, no handoffs: what the steps cost
// when nothing else is in the way, to set against the 2.9 us a 64-row tile takes in `tma`.
// PROBE_MODE (a define) picks what the two warpgroups run:
//   0  warpgroup 0 issues S, warpgroup 1 idles      1  both issue S
//   2  warpgroup 0 issues P V, warpgroup 1 idles    3  both issue P V (their own value columns)
//   4  both issue S then P V, each waited for (a tile's tensor work per warpgroup, as in the
//      kernels, with nothing between the steps)
//   5  both issue S with its four rope k-steps (Q columns 512..575) taking A from registers (RS),
//      as FlashMLA does to free Q's rope tile in shared memory for a second P buffer
// Both warpgroups run one code path in modes 1, 3, 4 and 5 (a branch on the warpgroup around
// different wgmma sequences makes ptxas serialise them, C7511); the loops stay rolled for the
// same reason. Shared memory (Q, one KV tile, P) is zero-filled once; values do not change the time.
#include "attention_common.cuh"
#include "attention_tile.cuh"
#include "attention_wgmma.cuh"
#include "attention_pingpong.cuh"

#ifndef PROBE_MODE
#define PROBE_MODE 1
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// S = Q K^T as pp_issue_s, except that the four rope k-steps take Q from registers (qr: the
// m16n8k16 A fragments of this warp's 16 rows, one per k-step).
__device__ __forceinline__ void probe_issue_s_rs(float (&s)[8][4], att_u32 sQ, att_u32 sK, const att_u32 (&qr)[4][4]) {
  pp_s_steps<ATT_D_V / 16>(s, sQ, sK);
#pragma unroll
  for (int t = 0; t < 4; ++t)
    wg_mma64_rs(&s[0][0], qr[t], wg_desc(sK + (ATT_D_V / 64) * 128 * FUSED_BN + t * 32, 16, 1024));
  wg_commit();
}

// `iters` steps of this warpgroup (S, P V over value columns 256 wg .., or S then P V); returns
// one accumulator (kept live).
template <bool S, bool PV, bool RS>
__device__ __forceinline__ float probe_steps(att_u32 sQ, att_u32 sK, att_u32 sP, int iters, int wg) {
  float s[8][4], o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  const att_u64 dP = wg_desc(sP, 16, 1024);
  att_u32 qr[4][4];  // RS: Q's rope columns of this warp's rows, from the (zeroed) Q tile
  const int lane = threadIdx.x & 31, r0 = 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2), tig = lane & 3;
#pragma unroll
  for (int t = 0; t < 4 * RS; ++t)
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const int r = r0 + 8 * (f & 1), c = ATT_D_V + 16 * t + 2 * tig + 8 * (f >> 1);
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(qr[t][f]) : "r"(sQ + fused_off(r, c >> 3, FUSED_BM) + 2 * (c & 7)));
    }
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if (S) {
      if (RS)
        probe_issue_s_rs(s, sQ, sK, qr);
      else
        pp_issue_s(s, sQ, sK);
      wg_wait_all();
      wg_pin<32>(&s[0][0]);
    }
    if (PV) {
      pp_issue_pv(o, 1.f, 1.f, dP, sK, wg);
      wg_wait_all();
      wg_pin<128>(o);
    }
  }
  return (S ? s[0][0] : 0.f) + (PV ? o[0] : 0.f);
}
#endif

extern "C" __global__ void __launch_bounds__(256, 1) wgmma_probe(float* __restrict__ out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = fused_smem_base(smem_raw);
  const att_u32 sQ = att_smem_addr(smem), sK = sQ + FUSED_SMEM_Q, sP = sK + FUSED_SMEM_KV;
  for (int i = threadIdx.x; i < (FUSED_SMEM_Q + FUSED_SMEM_KV + FUSED_SMEM_P) / 16; i += blockDim.x)
    reinterpret_cast<int4*>(smem)[i] = make_int4(0, 0, 0, 0);
  att_fence_proxy_async();  // the zeros, visible to wgmma
  __syncthreads();
  const int wg = threadIdx.x >> 7;
  constexpr bool kS = PROBE_MODE == 0 || PROBE_MODE == 1 || PROBE_MODE == 4 || PROBE_MODE == 5;
  constexpr bool kPV = PROBE_MODE == 2 || PROBE_MODE == 3 || PROBE_MODE == 4;
  constexpr bool kBoth = PROBE_MODE != 0 && PROBE_MODE != 2;
  float acc = 0.f;
  if (kBoth || wg == 0) acc = probe_steps<kS, kPV, PROBE_MODE == 5>(sQ, sK, sP, iters, wg);
  if (acc == 12345.f) out[threadIdx.x] = acc;  // never in practice: keeps the accumulators live
#endif
}
