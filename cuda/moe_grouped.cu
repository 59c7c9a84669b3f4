// The routed experts of an MoE layer as a weight stream: permutation, grouped skinny GEMMs, combine.
//
// On one GPU of an expert-parallel deployment a verify step gives each local expert few tokens
// (Kimi K2 EP8: about T / 48 of T tokens), so the expert GEMMs are a stream of expert weights
// with a narrow token dimension. These kernels read every touched expert's weights once, with
// many bytes in flight, and put the tokens on the mma's narrow side:
//
// * moe_permute (one block): groups the (token, slot) pairs by local expert (cuda/moe_permute.cuh:
//   group ends ``offs``, each slot's position ``pos``, each position's token ``rowidx``, the
//   experts with tokens ``active``). At few tokens the router's finaliser does this itself.
// * moe_grouped_gemm: out[p, n] = sum_k x[row(p), k] w[e, n, k] for the positions p of expert e.
//   Block (row tile, grid row): the shared expert's chunks, then routed rows that walk the list
//   of experts with tokens (``active``), so that no block is spent on the experts a step leaves
//   untouched (on one GPU of Kimi K2 EP8 a single token touches about 1 of the 48 local experts:
//   a grid row per local expert made 47 of every 48 blocks exit at once, and a row per possible
//   expert, min(48, T k), still left over 1000 empty blocks at T = 1, dispatched after the
//   working ones and holding back the next kernel's start). MOE_KSPLIT warps split K (warp w takes the 64-wide steps w,
//   w + MOE_KSPLIT, ..., so a block reads MOE_KSPLIT x 128 contiguous bytes of each row at a
//   time), each streaming its steps through a private cp.async ring (every thread reads back
//   only the bytes it copied, so no barrier is needed until the split-K reduction). mma.sync
//   m16n8k16 with 16 weight rows on M and 8 tokens on N; the K order inside each 64-wide step
//   is permuted the same way for A and B: thread q of a row group copies bytes 16q .. 16q + 15
//   and 64 + 16q .. 64 + 16q + 15 of the step (each copy instruction covers whole 32-byte
//   sectors), and those 16 values are its fragments of four k16 steps. Tokens come in chunks of 8 * MOE_NT; an expert with more re-streams its weights
//   per chunk. MOE_GATED = 1: w0 = gate, w1 = up (16 rows of each per block), the output is
//   bf16 silu(gate) * up; MOE_GATED = 0: 32 rows of w0 per block, float32 output. The shared
//   expert rides along as an extra group whose positions are all T tokens (after the routed
//   slots), one grid row per chunk of them (the first rows), with its own weights, row count and K: one gate/up
//   and one down launch serve the routed and the shared experts.
// * moe_combine: out[t] = ys[shared row of t] + sum_s weight[t, s] * ys[pos[t, s]] over the local
//   slots, in float32, slots in order.
//
// Compile-time options (-D): MOE_K (input width, a multiple of 64 * MOE_KSPLIT), MOE_NT (token
// tiles of 8 per chunk), MOE_GATED, MOE_STAGES (ring depth), MOE_KSPLIT (warps per block),
// MOE_TOPK (slots per token, combine), MOE_TRACE (cuda/moe_trace.cuh: per-block timestamps).
// No system headers: compiles under NVRTC and nvcc.
//
// All three kernels are launched with programmatic dependent launch (cuda/pdl.cuh): each starts
// while the one before it runs, waits for it before it reads its outputs, and lets the next one
// start at once. The router lets the permutation start, the permutation the gate/up GEMM, whose
// shared-expert blocks (``early``) stream their weights and x while the router runs and wait
// only before they store; the routed blocks wait for the permutation.

#include "moe_permute.cuh"
#include "moe_trace.cuh"
#include "pdl.cuh"

#ifndef MOE_K
#define MOE_K 7168
#endif
#ifndef MOE_NT
#define MOE_NT 1
#endif
#ifndef MOE_GATED
#define MOE_GATED 1
#endif
#ifndef MOE_STAGES
#define MOE_STAGES 4
#endif
#ifndef MOE_KSPLIT
#define MOE_KSPLIT 4
#endif
#ifndef MOE_TOPK
#define MOE_TOPK 8
#endif

typedef unsigned short moe_bf16;
typedef unsigned int moe_u32;

#define MOE_KW (MOE_K / MOE_KSPLIT)          // K per warp
#define MOE_KSTEPS (MOE_KW / 64)              // 64-wide steps per warp
#define MOE_KSTRIDE (64 * MOE_KSPLIT)         // elements between a warp's steps
#define MOE_NA 8                              // A uint4 per thread per step: 2 tiles x 2 rows x 32 bytes
#define MOE_NB (2 * MOE_NT)                   // B uint4 per thread per step
#define MOE_NSLOT (MOE_NA + MOE_NB)
#define MOE_ROWS (MOE_GATED ? 16 : 32)        // output rows per block

#if MOE_KW % 64 != 0
#error "MOE_K must be a multiple of 64 * MOE_KSPLIT"
#endif

__device__ __forceinline__ float moe_bf16_to_f32(moe_bf16 h) { return __uint_as_float(((moe_u32)h) << 16); }

__device__ __forceinline__ moe_bf16 moe_f32_to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ void moe_cp_async16(moe_u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ moe_u32 moe_word(const uint4& lo, const uint4& hi, int w) {
  const uint4& u = w < 4 ? lo : hi;
  switch (w & 3) {
    case 0: return u.x;
    case 1: return u.y;
    case 2: return u.z;
    default: return u.w;
  }
}

__device__ __forceinline__ void moe_mma(float* c, moe_u32 a0, moe_u32 a1, moe_u32 a2, moe_u32 a3, moe_u32 b0,
                                        moe_u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(1024) moe_permute(const long long* __restrict__ expert, int slots, int k,
                                                               int experts, int* __restrict__ offs,
                                                               int* __restrict__ rowidx, int* __restrict__ pos,
                                                               int* __restrict__ active) {
  __shared__ int start[MOE_MAX_EXPERTS];
  __shared__ int total;
  MoeTrace trace;
  pdl_launch_dependents();  // nothing before the wait: the gate/up GEMM may start now
  pdl_wait();
  trace.waited();
  moe_permute_block([&](int i) { return expert[i]; }, slots, k, experts, start, &total, offs, rowidx, pos, active);
}

// x [rows, MOE_K] bf16; rowidx [positions] (row of x for each position) or null (position = row);
// w0, w1 [experts, n_out, MOE_K] bf16 (w1 read only when MOE_GATED); offs [experts] group ends;
// active [>= groups]: the experts with tokens (then -1), or null (entry g is expert g); out
// [positions, n_out]: bf16 when MOE_GATED, else float32. grid (n_out / MOE_ROWS, chunks + rows)
// with chunks = ceil(shared_tokens / (8 MOE_NT)) shared rows first, then 1 <= rows <= groups
// routed rows: routed row j takes the entries j, j + rows, ... of active
// (of the first ``groups``) until one is -1, so that a grid sized for the experts a step
// usually touches leaves no empty blocks when fewer have tokens (empty blocks are dispatched
// after every working one, and a kernel behind this one cannot start before the last is).
// The extra group (the shared expert), when shared_tokens > 0: weights s0 (and s1 when MOE_GATED)
// [n_shared, k_shared] bf16, k_shared a multiple of 64 * MOE_KSPLIT and at most MOE_K, n_shared a
// multiple of MOE_ROWS and at most n_out; its positions shared_first .. shared_first +
// shared_tokens - 1 read token p - shared_first of x through the gather (row p without rowidx),
// in chunks of 8 * MOE_NT tokens, one per grid row. early != 0: the
// shared rows' blocks read x and their weights before ``pdl_wait`` (only when x was complete
// before the kernel launched just before this one, as the layer's gate/up GEMM after the
// permutation); 0: every block waits first.
extern "C" __global__ void __launch_bounds__(32 * MOE_KSPLIT)
    moe_grouped_gemm(const moe_bf16* __restrict__ x, const int* __restrict__ rowidx, const moe_bf16* __restrict__ w0,
                     const moe_bf16* __restrict__ w1, const int* __restrict__ offs, const int* __restrict__ active,
                     void* __restrict__ out, int n_out, const moe_bf16* __restrict__ s0,
                     const moe_bf16* __restrict__ s1, int n_shared, int k_shared, int shared_first,
                     int shared_tokens, int early, int groups) {
  extern __shared__ uint4 ring[];  // [MOE_KSPLIT][MOE_STAGES][MOE_NSLOT][32]
  const int chunks = (shared_tokens + 8 * MOE_NT - 1) / (8 * MOE_NT), rows = (int)gridDim.y - chunks;
  const int y = blockIdx.y;
  const bool sh = y < chunks;         // the shared expert's rows first: they need no routing
  const bool wait_late = sh && early;  // x was complete before the kernel before this one
  MoeTrace trace;
  if (!wait_late) {
    pdl_wait();
    trace.waited();
  }
  pdl_launch_dependents();
  const int r0 = blockIdx.x * MOE_ROWS;
  if (sh && r0 >= n_shared) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const long long kofs = (long long)warp * 64 + q * 8;
  // A shared row has one item, its chunk; routed row j the entries j, j + rows, ... of active.
  for (int item = sh ? 0 : y - chunks; item < (sh ? 1 : groups); item += sh ? 1 : rows) {
    int first, end, e = 0;
    if (sh) {
      first = shared_first + y * 8 * MOE_NT;
      end = min(first + 8 * MOE_NT, shared_first + shared_tokens);
    } else {
      e = active ? active[item] : item;
      if (e < 0) break;  // the experts with tokens come first in active
      first = e ? offs[e - 1] : 0;
      end = offs[e];
    }
    if (first >= end) continue;
    const long long kw = sh ? k_shared : MOE_K;       // the weights' row length
    const int ksteps = sh ? k_shared / MOE_KSTRIDE : MOE_KSTEPS;
    const moe_bf16* wa = sh ? s0 : w0 + (long long)e * n_out * MOE_K;
#if MOE_GATED
    const moe_bf16* wb = sh ? s1 : w1 + (long long)e * n_out * MOE_K;
#else
    const moe_bf16* wb = wa + 16LL * kw;
#endif
    const moe_bf16* arow[4] = {wa + (r0 + g) * kw + kofs, wa + (r0 + g + 8) * kw + kofs,
                               wb + (r0 + g) * kw + kofs, wb + (r0 + g + 8) * kw + kofs};
    uint4* mine = ring + warp * MOE_STAGES * MOE_NSLOT * 32 + lane;
    const moe_u32 mine_s = (moe_u32)__cvta_generic_to_shared(mine);

    for (int c0 = first; c0 < end; c0 += 8 * MOE_NT) {
      const moe_bf16* brow[MOE_NT];
      int bbytes[MOE_NT];
#pragma unroll
      for (int j = 0; j < MOE_NT; ++j) {
        const int p = c0 + j * 8 + g;
        const bool ok = p < end;
        const int row = ok ? (rowidx ? (sh ? p - shared_first : rowidx[p]) : p) : 0;
        brow[j] = x + (long long)row * MOE_K + kofs;
        bbytes[j] = ok ? 16 : 0;  // zero fill past the expert's tokens
      }
      auto issue = [&](int stage, int ks) {
        const int kk = ks * MOE_KSTRIDE;
        const moe_u32 dst = mine_s + stage * MOE_NSLOT * 32 * 16;
#pragma unroll
        for (int i = 0; i < MOE_NA; ++i) moe_cp_async16(dst + i * 32 * 16, arow[i >> 1] + kk + (i & 1) * 32, 16);
#pragma unroll
        for (int j = 0; j < MOE_NB; ++j)
          moe_cp_async16(dst + (MOE_NA + j) * 32 * 16, brow[j >> 1] + kk + (j & 1) * 32, bbytes[j >> 1]);
      };
      float acc[2][MOE_NT][4];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < MOE_NT; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[t][j][c] = 0.f;

#pragma unroll
      for (int s = 0; s < MOE_STAGES - 1; ++s) {
        if (s < ksteps) issue(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
      }
#pragma unroll 1
      for (int ks = 0; ks < ksteps; ++ks) {
        const int kn = ks + MOE_STAGES - 1;
        if (kn < ksteps) issue(kn % MOE_STAGES, kn);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(MOE_STAGES - 1));
        const uint4* buf = mine + (ks % MOE_STAGES) * MOE_NSLOT * 32;
        uint4 a[MOE_NA], b[MOE_NB];
#pragma unroll
        for (int i = 0; i < MOE_NA; ++i) a[i] = buf[i * 32];
#pragma unroll
        for (int j = 0; j < MOE_NB; ++j) b[j] = buf[(MOE_NA + j) * 32];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            // a[t*4 + h*2 + u]: tile t, row g + 8h, the thread's 16 bytes of half u of the step
            const moe_u32 x0 = moe_word(a[t * 4 + 0], a[t * 4 + 1], 2 * s);
            const moe_u32 x1 = moe_word(a[t * 4 + 2], a[t * 4 + 3], 2 * s);
            const moe_u32 x2 = moe_word(a[t * 4 + 0], a[t * 4 + 1], 2 * s + 1);
            const moe_u32 x3 = moe_word(a[t * 4 + 2], a[t * 4 + 3], 2 * s + 1);
#pragma unroll
            for (int j = 0; j < MOE_NT; ++j)
              moe_mma(acc[t][j], x0, x1, x2, x3, moe_word(b[2 * j], b[2 * j + 1], 2 * s),
                      moe_word(b[2 * j], b[2 * j + 1], 2 * s + 1));
          }
        }
      }
      asm volatile("cp.async.wait_group 0;\n" ::);
      if (wait_late) {  // the first store: the kernels before have completed
        pdl_wait();
        trace.waited();
      }
      __syncthreads();  // every warp is done with its ring: reuse it for the split-K partials
      float* red = reinterpret_cast<float*>(ring);  // [MOE_KSPLIT][2][MOE_NT][4][32]
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < MOE_NT; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) red[(((warp * 2 + t) * MOE_NT + j) * 4 + c) * 32 + lane] = acc[t][j][c];
      __syncthreads();
      const int per_tile = MOE_NT * 4 * 32;
      for (int idx = threadIdx.x; idx < (MOE_GATED ? 1 : 2) * per_tile; idx += 32 * MOE_KSPLIT) {
        const int t = idx / per_tile, rest = idx % per_tile, j = rest / 128, c = (rest / 32) & 3, l = rest & 31;
        const int p = c0 + j * 8 + 2 * (l & 3) + (c & 1);
        if (p >= end) continue;
        const int row = r0 + t * 16 + (l >> 2) + (c >> 1) * 8;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < MOE_KSPLIT; ++w) v += red[(w * 2 + t) * per_tile + rest];
#if MOE_GATED
        float u = 0.f;
#pragma unroll
        for (int w = 0; w < MOE_KSPLIT; ++w) u += red[(w * 2 + 1) * per_tile + rest];
        reinterpret_cast<moe_bf16*>(out)[(long long)p * n_out + row] = moe_f32_to_bf16(v / (1.f + __expf(-v)) * u);
#else
        reinterpret_cast<float*>(out)[(long long)p * n_out + row] = v;
#endif
      }
      __syncthreads();  // the partials are read before the next chunk's copies land in the ring
    }
  }
}

// ys [positions, dim] float32; pos [tokens * MOE_TOPK] (position or -1); weight [tokens * MOE_TOPK]
// float32; shared_first: the position of token 0's shared-expert row (token t's at shared_first +
// t, added with weight 1), or -1; out [tokens, dim] bf16. grid (tokens, column slices), dim % 4 == 0:
// block (t, c) takes columns 4 (c blockDim + threadIdx) + 4 blockDim gridDim.y j (a single token's
// 7168 columns in one block were a chain of dependent loads).
extern "C" __global__ void __launch_bounds__(256)
    moe_combine(const float* __restrict__ ys, const int* __restrict__ pos, const float* __restrict__ weight,
                int shared_first, moe_bf16* __restrict__ out, int dim) {
  MoeTrace trace;
  pdl_wait();
  trace.waited();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  int p[MOE_TOPK];
  float wt[MOE_TOPK];
#pragma unroll
  for (int s = 0; s < MOE_TOPK; ++s) {
    p[s] = pos[t * MOE_TOPK + s];
    wt[s] = weight[t * MOE_TOPK + s];
  }
  for (int d = (blockIdx.y * blockDim.x + threadIdx.x) * 4; d < dim; d += gridDim.y * blockDim.x * 4) {
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (shared_first >= 0) {
      const float4 y = *reinterpret_cast<const float4*>(ys + (long long)(shared_first + t) * dim + d);
      v[0] = y.x;
      v[1] = y.y;
      v[2] = y.z;
      v[3] = y.w;
    }
#pragma unroll
    for (int s = 0; s < MOE_TOPK; ++s) {
      if (p[s] < 0) continue;
      const float4 y = *reinterpret_cast<const float4*>(ys + (long long)p[s] * dim + d);
      v[0] += wt[s] * y.x;
      v[1] += wt[s] * y.y;
      v[2] += wt[s] * y.z;
      v[3] += wt[s] * y.w;
    }
    uint2 o;
    o.x = (moe_u32)moe_f32_to_bf16(v[0]) | ((moe_u32)moe_f32_to_bf16(v[1]) << 16);
    o.y = (moe_u32)moe_f32_to_bf16(v[2]) | ((moe_u32)moe_f32_to_bf16(v[3]) << 16);
    *reinterpret_cast<uint2*>(out + (long long)t * dim + d) = o;
  }
}
