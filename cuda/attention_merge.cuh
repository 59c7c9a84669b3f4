// The split merge inside a split launch (sm_90a; the pair kernel, verify_attention_pair.cu).
//
// A launch of S > 1 KV splits leaves S partial results per query row: O normalised (fp32) and its
// lse (log2). verify_combine (verify_attention.cu) merges them in a second launch, which on an H200
// added 5.6-12.5 us to calls of 32-120 us (docs/perf_log.md, session 22): it waits for the whole
// split launch, and then every partial crosses the L2 twice. Here the S blocks of a row tile merge
// their own results instead. The value columns are cut into S slices of 8-column units; split s
// keeps slice s of its O in shared memory and writes the others to its partial slot, then the S
// blocks meet at a counter in global memory, and split s copies slice s of the other splits' O
// into its shared memory (bulk copies, all in flight at once) and merges it with its own into the
// output. A block writes (S - 1) / S of its O and reads as much back, where the two launches wrote
// all of it and read all of it again. Every load of the merge is in flight with the others: read
// one slot after another, each waited for, they took 10-20 us at B = 1, N = 33, H = 64, P = 4096.
//
// The blocks of a row tile wait for each other, so all of them must be resident at once: the host
// runs this path only as a cooperative launch of at most one block per SM (the driver refuses it
// otherwise), one pass of the ordinary fused function (mode 0, partial slots 0 .. S - 1), at most
// MERGE_MAX_SPLITS splits.
//
// The merge computes what verify_combine computes, in the same order and with the same operations
// (the lse-weighted sum over slots 0 .. S - 1 of the normalised partials), so both paths give the
// same bits; a test holds them to it.
#ifndef KDTREE_ATTENTION_MERGE_CUH
#define KDTREE_ATTENTION_MERGE_CUH

#include "attention_pingpong.cuh"
#include "attention_tile.cuh"
#include "attention_trace.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MERGE_UNITS (ATT_D_V / 8)                    // 8-column units of a value row
#define MERGE_MAX_SPLITS 8                             // kdtree.attention._MERGE_MAX_SPLITS
// Trace records of the merge (-DATT_TRACE): event ATT_EV_EMPTY, these in the tile field.
#define MERGE_TR_STORED 1000   // the block's partials stored, its slice staged
#define MERGE_TR_MET 1001      // every split of the row tile arrived
#define MERGE_TR_LSE 1002      // every split's lse in shared memory
#define MERGE_TR_WEIGHTS 1003  // the weights
#define MERGE_TR_LANDED 1004   // the other splits' slices landed
// Shared memory of the merge, from the kernel's 1024-aligned base: the own slice (64 rows, padded
// stride), the other splits' slices (64 rows each, unpadded), the slot weights, one mbarrier.
#define MERGE_REMOTE_OFF (64 * 280 * 4)
#define MERGE_REMOTE_BYTES (6 * FUSED_BM * 32 * 10)  // the most: S = 7 (6 others' slices of up to 10 units)
#define MERGE_W_OFF (MERGE_REMOTE_OFF + MERGE_REMOTE_BYTES)
#define MERGE_BAR_OFF (MERGE_W_OFF + MERGE_MAX_SPLITS * FUSED_BM * 4)
#define MERGE_SMEM_BYTES (MERGE_BAR_OFF + 8)

// Copy engine, no tensor map: `bytes` (a multiple of 16) from global src to shared dst, counted on
// mbarrier `bar`.
__device__ __forceinline__ void merge_bulk_load(att_u32 dst, const void* src, int bytes, att_u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
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

// The end of a block of split launch 1 < S <= MERGE_MAX_SPLITS that merges in the launch: in place
// of pp_consumers_end. `smem` (1024-aligned) holds MERGE_SMEM_BYTES no longer in use; `sync` holds
// two counters per (sequence, row tile), zero between launches.
__device__ __forceinline__ void pair_merge_end(const float (&o)[128], float l_lo, float l_hi, att_bf16* out,
                                               float* lse, float* o_part, float* lse_part, const FusedBlock& k,
                                               int B, int S, float* sRed, const float* sM, unsigned char* smem,
                                               int* sync, int wg, int r_lo, int tig, int tid, int nb, AttTrace& tr) {
  float* stage = reinterpret_cast<float*>(smem);
  float* remote = reinterpret_cast<float*>(smem + MERGE_REMOTE_OFF);
  float* sW = reinterpret_cast<float*>(smem + MERGE_W_OFF);
  const att_u32 bar = att_smem_addr(smem + MERGE_BAR_OFF);
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
  if (tid == 0) {
    mb_init(bar, 1);
    mb_init_fence();
  }
  nb_sync(nb, 256);  // every thread's partials stored, the slice staged, the barrier initialised
  att_trace_rec(tr, ATT_EV_EMPTY, MERGE_TR_STORED);
  int* arrive = sync + 2 * (k.b * gridDim.x + blockIdx.x);
  if (tid == 0) {
    __threadfence();  // the block's partials (ordered before it by the barrier), visible before it arrives
    atomicAdd(arrive, 1);
    while (merge_load_acquire(arrive) < S) __nanosleep(32);
    if (atomicAdd(arrive + 1, 1) == S - 1) {  // the last block past the wait resets both counters
      arrive[0] = 0;
      arrive[1] = 0;
    }
  }
  nb_sync(nb, 256);  // every split's partials written
  att_trace_rec(tr, ATT_EV_EMPTY, MERGE_TR_MET);
  const size_t stride = (size_t)B * k.NH, row0 = (size_t)k.b * k.NH + k.g0;
  const int rows = min(FUSED_BM, k.NH - k.g0);
  if (tid < 32) {  // the other splits' slices of the tile's rows, one bulk copy a (split, row)
    asm volatile("fence.proxy.async.global;\n" ::: "memory");  // their writes, before the copy engine reads
    if (tid == 0) mb_arrive_expect_tx(bar, (S - 1) * rows * 32 * nu);
    __syncwarp();
    for (int c = tid; c < (S - 1) * rows; c += 32) {
      const int j = c / rows, r = c - j * rows, s = j + (j >= k.split);
      merge_bulk_load(att_smem_addr(remote + (j * FUSED_BM + r) * 8 * nu),
                      o_part + (s * stride + row0 + r) * ATT_D_V + 8 * u0, 32 * nu, bar);
    }
  }
  {  // every split's lse of the tile's rows into sW: a thread's two loads in flight together (a load
     // each slot after slot, waited for one by one, took 10 us)
    const int n = S * rows, t0 = tid, t1 = tid + 256;
    const float v0 = t0 < n ? __ldcg(lse_part + (t0 / rows) * stride + row0 + t0 % rows) : 0.f;
    const float v1 = t1 < n ? __ldcg(lse_part + (t1 / rows) * stride + row0 + t1 % rows) : 0.f;
    if (t0 < n) sW[(t0 / rows) * FUSED_BM + t0 % rows] = v0;
    if (t1 < n) sW[(t1 / rows) * FUSED_BM + t1 % rows] = v1;
  }
  nb_sync(nb, 256);  // the lse values
  att_trace_rec(tr, ATT_EV_EMPTY, MERGE_TR_LSE);
  if (tid < rows) {  // the row's slot weights in their place, as verify_combine's
    float mx = ATT_NEG_INF;
    for (int s = 0; s < S; ++s) mx = fmaxf(mx, sW[s * FUSED_BM + tid]);
    float sum = 0.f;
    if (mx != ATT_NEG_INF)
      for (int s = 0; s < S; ++s) sum += att_exp2(sW[s * FUSED_BM + tid] - mx);
    const float inv = 1.f / sum;
    for (int s = 0; s < S; ++s)
      sW[s * FUSED_BM + tid] = sum > 0.f ? att_exp2(sW[s * FUSED_BM + tid] - mx) * inv : 0.f;
    if (k.split == 0) lse[row0 + tid] = sum > 0.f ? (mx + att_log2(sum)) * ATT_LN2 : ATT_NEG_INF;
  }
  nb_sync(nb, 256);  // the weights
  att_trace_rec(tr, ATT_EV_EMPTY, MERGE_TR_WEIGHTS);
  mb_wait(bar, 0);   // the other splits' slices
  att_trace_rec(tr, ATT_EV_EMPTY, MERGE_TR_LANDED);
  const int per_row = 2 * nu;
  for (int it = tid; it < rows * per_row; it += 256) {
    const int r = it / per_row, f = it - r * per_row;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < S; ++s) {
      const float w = sW[s * FUSED_BM + r];
      const float* x4 = s == k.split ? stage + r * ld + 4 * f
                                     : remote + ((s - (s > k.split)) * FUSED_BM + r) * 8 * nu + 4 * f;
      const float4 x = *reinterpret_cast<const float4*>(x4);
      acc.x += w * x.x;
      acc.y += w * x.y;
      acc.z += w * x.z;
      acc.w += w * x.w;
    }
    *reinterpret_cast<uint2*>(out + (row0 + r) * ATT_D_V + 8 * u0 + 4 * f) =
        make_uint2(att_pack_bf16x2(acc.x, acc.y), att_pack_bf16x2(acc.z, acc.w));
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
#endif  // KDTREE_ATTENTION_MERGE_CUH
