// The split merge inside a split launch (sm_90a; the pair kernel, verify_attention_pair.cu).
//
// A launch of S > 1 KV splits leaves S partial results per query row: O normalised (fp32) and its
// lse (log2). verify_combine (verify_attention.cu) merges them in a second launch, which on an H200
// added 5.6-12.5 us to calls of 32-120 us (docs/perf_log.md, session 22): it waits for the whole
// split launch, and then every partial crosses the L2 twice. Here the S blocks of a row tile merge
// their own results instead. The value columns are cut into S slices of 8-column units; split s
// keeps slice s of its O in shared memory and writes the others to its partial slot, then the S
// blocks meet at a counter in global memory, and split s merges slice s of every split's O into
// the output. A block writes (S - 1) / S of its O and reads as much back, where the two launches
// wrote all of it and read all of it again.
//
// The blocks of a row tile wait for each other, so all of them must be resident at once: the host
// runs this path only as a cooperative launch of at most one block per SM (the driver refuses it
// otherwise), one pass of the ordinary fused function (mode 0, partial slots 0 .. S - 1).
//
// The merge computes what verify_combine computes, in the same order and with the same operations
// (the lse-weighted sum over slots 0 .. S - 1 of the normalised partials), so both paths give the
// same bits; a test holds them to it.
#ifndef KDTREE_ATTENTION_MERGE_CUH
#define KDTREE_ATTENTION_MERGE_CUH

#include "attention_pingpong.cuh"
#include "attention_tile.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MERGE_UNITS (ATT_D_V / 8)                    // 8-column units of a value row
#define MERGE_ITEMS (FUSED_BM * ATT_D_V / 4 / 2 / 256)  // float4s a thread merges at S = 2 (the most)

__device__ __forceinline__ float merge_ldcg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ float4 merge_ldcg4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ int merge_load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Split s of S merges value-column units [merge_u0(s, S), merge_u0(s + 1, S)).
__device__ __forceinline__ int merge_u0(int s, int S) { return MERGE_UNITS * s / S; }

// The staged slice's row stride in floats: 8 per unit, padded so that consecutive rows start 8
// banks apart (the quads of a warp store 8 rows at once).
__device__ __forceinline__ int merge_stride(int nu) { return 8 * nu + ((8 - 8 * nu) & 31); }

// The end of a block of split launch S > 1 that merges in the launch: in place of
// pp_consumers_end. `stage` (>= 64 x 280 floats) and `sW` (S x 64 floats) are free shared memory;
// `sync` holds two counters per (sequence, row tile), zero between launches.
__device__ __forceinline__ void pair_merge_end(const float (&o)[128], float l_lo, float l_hi, att_bf16* out,
                                               float* lse, float* o_part, float* lse_part, const FusedBlock& k,
                                               int B, int S, float* sRed, const float* sM, float* stage, float* sW,
                                               int* sync, int wg, int r_lo, int tig, int tid, int nb) {
  pp_row_sums(l_lo, l_hi, sRed, wg, r_lo, r_lo + 8, tig);
  nb_sync(nb, 256);  // both partial sums and the final sM
  fused_store_lse(lse, lse_part, true, k, B, 0, sRed, sM, tid);
  const int u0 = merge_u0(k.split, S), nu = merge_u0(k.split + 1, S) - u0, ld = merge_stride(nu);
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // as fused_store_o_half, but this split's slice to `stage`
    const int r = r_lo + 8 * half;
    const bool valid = k.g0 + r < k.NH;
    const float l = sRed[r] + sRed[FUSED_BM + r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int u = 32 * wg + j - u0;
      const float x0 = o[4 * j + 2 * half] * inv, x1 = o[4 * j + 2 * half + 1] * inv;
      if (u >= 0 && u < nu)
        *reinterpret_cast<float2*>(stage + r * ld + 8 * u + 2 * tig) = make_float2(x0, x1);
      else if (valid)
        fused_store_pair(out, o_part, k, B, 0, r, 8 * (u + u0) + 2 * tig, x0, x1);
    }
  }
  __threadfence();   // this thread's partials, visible on the GPU before the block arrives
  nb_sync(nb, 256);  // every thread's partials fenced, the slice staged
  int* arrive = sync + 2 * (k.b * gridDim.x + blockIdx.x);
  if (tid == 0) {
    atomicAdd(arrive, 1);
    while (merge_load_acquire(arrive) < S) __nanosleep(32);
    if (atomicAdd(arrive + 1, 1) == S - 1) {  // the last block past the wait resets both counters
      arrive[0] = 0;
      arrive[1] = 0;
    }
  }
  nb_sync(nb, 256);  // every split's partials written
  const size_t stride = (size_t)B * k.NH, row0 = (size_t)k.b * k.NH + k.g0;
  if (tid < FUSED_BM && k.g0 + tid < k.NH) {  // the row's slot weights, as verify_combine's
    float mx = ATT_NEG_INF;
    for (int s = 0; s < S; ++s) mx = fmaxf(mx, merge_ldcg(lse_part + s * stride + row0 + tid));
    float sum = 0.f;
    if (mx != ATT_NEG_INF)
      for (int s = 0; s < S; ++s) sum += att_exp2(merge_ldcg(lse_part + s * stride + row0 + tid) - mx);
    const float inv = 1.f / sum;
    for (int s = 0; s < S; ++s)
      sW[s * FUSED_BM + tid] = sum > 0.f ? att_exp2(merge_ldcg(lse_part + s * stride + row0 + tid) - mx) * inv : 0.f;
    if (k.split == 0) lse[row0 + tid] = sum > 0.f ? (mx + att_log2(sum)) * ATT_LN2 : ATT_NEG_INF;
  }
  nb_sync(nb, 256);  // the weights
  const int per_row = 2 * nu, rows = min(FUSED_BM, k.NH - k.g0), items = rows * per_row;
  float4 acc[MERGE_ITEMS];
#pragma unroll
  for (int m = 0; m < MERGE_ITEMS; ++m) acc[m] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < S; ++s) {
    const float* part = o_part + (s * stride + row0) * ATT_D_V + 8 * u0;
#pragma unroll
    for (int m = 0; m < MERGE_ITEMS; ++m) {
      const int it = tid + 256 * m;
      if (it < items) {
        const int r = it / per_row, f = it - r * per_row;
        const float w = sW[s * FUSED_BM + r];
        const float4 x = s == k.split ? *reinterpret_cast<const float4*>(stage + r * ld + 4 * f)
                                      : merge_ldcg4(part + (size_t)r * ATT_D_V + 4 * f);
        acc[m].x += w * x.x;
        acc[m].y += w * x.y;
        acc[m].z += w * x.z;
        acc[m].w += w * x.w;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MERGE_ITEMS; ++m) {
    const int it = tid + 256 * m;
    if (it < items) {
      const int r = it / per_row, f = it - r * per_row;
      *reinterpret_cast<uint2*>(out + (row0 + r) * ATT_D_V + 8 * u0 + 4 * f) =
          make_uint2(att_pack_bf16x2(acc[m].x, acc[m].y), att_pack_bf16x2(acc[m].z, acc[m].w));
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
#endif  // KDTREE_ATTENTION_MERGE_CUH
