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
//   The rows_n layout (KV tokens on M, PROBE_N query rows on N; verify_attention_rows_n.cu),
//   each warpgroup on its own accumulators:
//   6  both issue S^T = K Q^T: 36 m64nNk16, A the KV tile (K-major), B the N rows of Q
//   7  both issue their half of O^T = V^T P^T: value blocks 4 wg .. 4 wg + 3, 4 k-steps each
//      (16 m64nNk16, A the KV tile read MN-major, B P^T)
// PROBE_N (a define, a width attention_wgmma.cuh defines: 8, 16, 24, 32, 64, 72) is N for modes
// 6 and 7; Q and P then hold max(64, N) rows.
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
#ifndef PROBE_N
#define PROBE_N 64
#endif
#define PROBE_ROWS (PROBE_N > FUSED_BM ? PROBE_N : FUSED_BM)  // rows of Q and of P in shared memory
#define PROBE_SMEM_Q (PROBE_ROWS * ATT_D_QK * 2)
#define PROBE_SMEM_P (PROBE_ROWS * FUSED_BN * 2)

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

// `iters` steps of one rows_n product on this warpgroup's accumulators: S^T of a tile (ST, mode 6)
// or O^T over the value blocks of this warpgroup's half (mode 7).
template <bool ST>
__device__ __forceinline__ float probe_steps_n(att_u32 sQ, att_u32 sK, att_u32 sP, int iters, int wg) {
  constexpr int R = PROBE_N / 2;  // accumulators a thread holds per m64nN block
  float s[R], o[4 * R];
#pragma unroll
  for (int j = 0; j < R; ++j) s[j] = 0.f;
#pragma unroll
  for (int j = 0; j < 4 * R; ++j) o[j] = 0.f;
  att_u32 kb = sK, qb = sQ, pb = sP;
  asm volatile("" : "+r"(kb), "+r"(qb), "+r"(pb));  // descriptors formed beside their wgmma
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if (ST) {
      wg_pin<R>(s);
      wg_fence();
#pragma unroll
      for (int ks = 0; ks < ATT_D_QK / 16; ++ks) {
        const att_u32 kk = (ks & 3) * 32;
        wg_mma<PROBE_N, 0>(s, wg_desc(kb + (ks >> 2) * (FUSED_BN * 128) + kk, 16, 1024),
                           wg_desc(qb + (ks >> 2) * (PROBE_ROWS * 128) + kk, 16, 1024));
      }
      wg_commit();
      wg_wait_all();
      wg_pin<R>(s);
    } else {
      wg_pin<4 * R>(o);
      wg_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int t = 0; t < FUSED_BN / 16; ++t)
          wg_mma<PROBE_N, 1>(o + i * R, wg_desc(kb + (4 * wg + i) * (FUSED_BN * 128) + t * 16 * 128, FUSED_BN * 128, 1024),
                             wg_desc(pb + 32 * t, 16, 1024));
      wg_commit();
      wg_wait_all();
      wg_pin<4 * R>(o);
    }
  }
  // Every block's accumulators feed the result: an empty asm emits no PTX, so wg_pin alone does
  // not keep ptxas from dropping a block whose registers nothing reads (it dropped three of four).
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < R; ++j) sum += ST ? s[j] : 0.f;
#pragma unroll
  for (int j = 0; j < 4 * R; ++j) sum += ST ? 0.f : o[j];
  return sum;
}
#endif

extern "C" __global__ void __launch_bounds__(256, 1) wgmma_probe(float* __restrict__ out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = fused_smem_base(smem_raw);
  const att_u32 sQ = att_smem_addr(smem), sK = sQ + PROBE_SMEM_Q, sP = sK + FUSED_SMEM_KV;
  for (int i = threadIdx.x; i < (PROBE_SMEM_Q + FUSED_SMEM_KV + PROBE_SMEM_P) / 16; i += blockDim.x)
    reinterpret_cast<int4*>(smem)[i] = make_int4(0, 0, 0, 0);
  att_fence_proxy_async();  // the zeros, visible to wgmma
  __syncthreads();
  const int wg = threadIdx.x >> 7;
  constexpr bool kS = PROBE_MODE == 0 || PROBE_MODE == 1 || PROBE_MODE == 4 || PROBE_MODE == 5;
  constexpr bool kPV = PROBE_MODE == 2 || PROBE_MODE == 3 || PROBE_MODE == 4;
  constexpr bool kBoth = PROBE_MODE != 0 && PROBE_MODE != 2;
  float acc = 0.f;
  if (PROBE_MODE >= 6)
    acc = probe_steps_n<PROBE_MODE == 6>(sQ, sK, sP, iters, wg);
  else if (kBoth || wg == 0)
    acc = probe_steps<kS, kPV, PROBE_MODE == 5>(sQ, sK, sP, iters, wg);
  if (acc == 12345.f) out[threadIdx.x] = acc;  // never in practice: keeps the accumulators live
#endif
}
