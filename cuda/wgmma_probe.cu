// Tensor-core rate of the verify kernels' two wgmma steps in isolation (sm_90a, nvcc): S = Q K^T
// exactly as the ping-pong kernels issue it (pp_issue_s: 36 m64n64k16, Q and K both read from
// shared memory) and O += P V (pp_issue_pv: the rescale and 4 m64n256k16 over one warpgroup's 256
// value columns, P and V from shared memory), each issued and waited for `iters` times in a row
// on one resident tile, one block per SM. No loads, no softmax, no handoffs: what the steps cost
// when nothing else is in the way, to set against the 2.9 us a 64-row tile takes in `tma`.
// PROBE_MODE (a define) picks what the two warpgroups run:
//   0  warpgroup 0 issues S, warpgroup 1 idles      1  both issue S
//   2  warpgroup 0 issues P V, warpgroup 1 idles    3  both issue P V (their own value columns)
//   4  both issue S then P V, each waited for (a tile's tensor work per warpgroup, as in the
//      kernels, with nothing between the steps)
// Both warpgroups run one code path in modes 1, 3 and 4 (a branch on the warpgroup around
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
// `iters` steps of this warpgroup (S, P V over value columns 256 wg .., or S then P V); returns
// one accumulator (kept live).
template <bool S, bool PV>
__device__ __forceinline__ float probe_steps(att_u32 sQ, att_u32 sK, att_u32 sP, int iters, int wg) {
  float s[8][4], o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  const att_u64 dP = wg_desc(sP, 16, 1024);
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if (S) {
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
  constexpr bool kS = PROBE_MODE == 0 || PROBE_MODE == 1 || PROBE_MODE == 4;
  constexpr bool kPV = PROBE_MODE == 2 || PROBE_MODE == 3 || PROBE_MODE == 4;
  constexpr bool kBoth = PROBE_MODE == 1 || PROBE_MODE == 3 || PROBE_MODE == 4;
  float acc = 0.f;
  if (kBoth || wg == 0) acc = probe_steps<kS, kPV>(sQ, sK, sP, iters, wg);
  if (acc == 12345.f) out[threadIdx.x] = acc;  // never in practice: keeps the accumulators live
#endif
}
