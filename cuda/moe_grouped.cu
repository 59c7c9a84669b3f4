// The routed experts of an MoE layer as a weight stream: permutation, grouped skinny GEMMs, combine.
//
// On one GPU of an expert-parallel deployment a verify step gives each local expert few tokens
// (Kimi K2 EP8: about T / 48 of T tokens), so the expert GEMMs are a stream of expert weights
// with a narrow token dimension. These kernels read every touched expert's weights once, with
// many bytes in flight, and put the tokens on the mma's narrow side:
//
// * moe_permute (one block): counts the (token, slot) pairs per local expert, scans them into
//   the group ends ``offs``, and writes for every local slot its position in expert order
//   (``pos``, -1 for other ranks' slots), per position the token it comes from (``rowidx``),
//   and the experts that have tokens, in ascending order (``active``, -1 past the last). The
//   order inside an expert follows shared-memory atomics, so it may change from run to run; nothing downstream depends on it (each token's rows are computed alone
//   and the combine sums a token's slots in slot order).
// * moe_grouped_gemm: out[p, n] = sum_k x[row(p), k] w[e, n, k] for the positions p of expert e.
//   Block (row tile, group): the shared expert's chunks first, then one grid row per expert
//   with tokens (``active``), so that no block is spent on the experts a step leaves untouched
//   (on one GPU of Kimi K2 EP8 a single token touches about 1 of the 48 local experts, and a
//   grid row per local expert made 47 of every 48 blocks exit at once: over 6000 empty blocks
//   queued ahead of the shared expert's). MOE_KSPLIT warps split K (warp w takes the 64-wide steps w,
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
// MOE_TOPK (slots per token, combine). No system headers: compiles under NVRTC and nvcc.
//
// All three kernels are launched with programmatic dependent launch (cuda/pdl.cuh): each starts
// while the one before it runs, waits for it before it reads its outputs, and lets the next one
// start at once. The router lets the permutation start, the permutation the gate/up GEMM, whose
// shared-expert blocks (``early``) stream their weights and x while the router runs and wait
// only before they store; the routed blocks wait for the permutation.

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
#define MOE_MAX_EXPERTS 1024

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
  const int tid = threadIdx.x, lane = tid & 31;
  pdl_launch_dependents();  // nothing before the wait: the gate/up GEMM may start now
  pdl_wait();
  for (int i = tid; i < experts; i += blockDim.x) start[i] = 0;
  __syncthreads();
  for (int i = tid; i < slots; i += blockDim.x) {
    const long long e = expert[i];
    pos[i] = (e >= 0 && e < experts) ? atomicAdd(&start[e], 1) : -1;  // rank inside the expert
  }
  __syncthreads();
  if (tid < 32) {  // counts -> exclusive starts, inclusive ends; the experts with tokens, in order
    int carry = 0, used = 0;
    for (int base = 0; base < experts; base += 32) {
      const int v = base + lane < experts ? start[base + lane] : 0;
      const unsigned nz = __ballot_sync(0xffffffffu, v > 0);
      if (v > 0) active[used + __popc(nz & ((1u << lane) - 1))] = base + lane;
      used += __popc(nz);
      int incl = v;
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
      }
      if (base + lane < experts) {
        start[base + lane] = carry + incl - v;
        offs[base + lane] = carry + incl;
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) total = carry;
    for (int i = used + lane; i < experts; i += 32) active[i] = -1;
  }
  __syncthreads();
  for (int i = tid; i < slots; i += blockDim.x) {
    const int r = pos[i];
    if (r >= 0) {
      const int p = start[(int)expert[i]] + r;
      pos[i] = p;
      rowidx[p] = i / k;
    }
  }
  for (int p = total + tid; p < slots; p += blockDim.x) rowidx[p] = 0;  // a valid row for gathers past the end
}

// ---- the pieces both GEMM kernels share ----

// The four weight rows a thread copies from (rows r0 + g, r0 + g + 8 of w0, or of the gate and up
// weights), at its column offset kofs: the shared expert's (sh) or expert e's.
__device__ __forceinline__ void moe_weight_rows(const moe_bf16* arow[4], bool sh, const moe_bf16* w0,
                                                const moe_bf16* w1, const moe_bf16* s0, const moe_bf16* s1, int e,
                                                int n_out, int r0, int k_shared, long long kofs) {
  const int g = (threadIdx.x & 31) >> 2;
  const long long kw = sh ? k_shared : MOE_K;  // the weights' row length
  const moe_bf16* wa = sh ? s0 : w0 + (long long)e * n_out * MOE_K;
#if MOE_GATED
  const moe_bf16* wb = sh ? s1 : w1 + (long long)e * n_out * MOE_K;
#else
  const moe_bf16* wb = wa + 16LL * kw;
#endif
  arow[0] = wa + (r0 + g) * kw + kofs;
  arow[1] = wa + (r0 + g + 8) * kw + kofs;
  arow[2] = wb + (r0 + g) * kw + kofs;
  arow[3] = wb + (r0 + g + 8) * kw + kofs;
}

// The x rows of the chunk's tokens c0 + 8 j + g (zero-filled past end): through rowidx, or
// token p - shared_first for the shared expert's positions, or row p without rowidx.
__device__ __forceinline__ void moe_token_rows(const moe_bf16* brow[MOE_NT], int bbytes[MOE_NT],
                                               const moe_bf16* x, const int* rowidx, bool sh, int shared_first,
                                               int c0, int end, long long kofs) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int j = 0; j < MOE_NT; ++j) {
    const int p = c0 + j * 8 + g;
    const bool ok = p < end;
    const int row = ok ? (rowidx ? (sh ? p - shared_first : rowidx[p]) : p) : 0;
    brow[j] = x + (long long)row * MOE_K + kofs;
    bbytes[j] = ok ? 16 : 0;  // zero fill past the expert's tokens
  }
}

// The warp's share of the block steps s0 .. s1 - 1 (MOE_KSTRIDE columns each, this warp's 64 of
// them) through its private cp.async ring, into acc (zeroed here).
__device__ __forceinline__ void moe_steps(float acc[2][MOE_NT][4], const moe_bf16* const arow[4],
                                          const moe_bf16* const brow[MOE_NT], const int bbytes[MOE_NT], int s0,
                                          int s1, const uint4* mine, moe_u32 mine_s) {
  auto issue = [&](int stage, int ks) {
    const int kk = ks * MOE_KSTRIDE;
    const moe_u32 dst = mine_s + stage * MOE_NSLOT * 32 * 16;
#pragma unroll
    for (int i = 0; i < MOE_NA; ++i) moe_cp_async16(dst + i * 32 * 16, arow[i >> 1] + kk + (i & 1) * 32, 16);
#pragma unroll
    for (int j = 0; j < MOE_NB; ++j)
      moe_cp_async16(dst + (MOE_NA + j) * 32 * 16, brow[j >> 1] + kk + (j & 1) * 32, bbytes[j >> 1]);
  };
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < MOE_NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[t][j][c] = 0.f;
#pragma unroll
  for (int s = 0; s < MOE_STAGES - 1; ++s) {
    if (s0 + s < s1) issue(s, s0 + s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
#pragma unroll 1
  for (int ks = s0; ks < s1; ++ks) {
    const int kn = ks + MOE_STAGES - 1;
    if (kn < s1) issue((kn - s0) % MOE_STAGES, kn);
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(MOE_STAGES - 1));
    const uint4* buf = mine + ((ks - s0) % MOE_STAGES) * MOE_NSLOT * 32;
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
}

// Every warp's accumulators into the ring, once all warps are done with it:
// red[((warp * 2 + t) * MOE_NT + j) * 4 + c][lane]. Returns red (valid after the barrier here).
__device__ __forceinline__ float* moe_warp_partials(const float acc[2][MOE_NT][4], uint4* ring) {
  __syncthreads();  // every warp is done with its ring: reuse it for the split-K partials
  float* red = reinterpret_cast<float*>(ring);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < MOE_NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[(((warp * 2 + t) * MOE_NT + j) * 4 + c) * 32 + lane] = acc[t][j][c];
  __syncthreads();
  return red;
}

// One output of an 8-token tile: accumulator c of lane l holds token p0 + 2 (l % 4) + c % 2, row
// row0 + l / 4 + 8 (c / 2). Gated: v the gate's sum and u the up's, written as bf16 silu(v) u;
// else v as float32.
__device__ __forceinline__ void moe_store(void* out, int n_out, int p0, int end, int row0, int c, int l, float v,
                                          float u) {
  const int p = p0 + 2 * (l & 3) + (c & 1);
  if (p >= end) return;
  const long long o = (long long)p * n_out + row0 + (l >> 2) + (c >> 1) * 8;
#if MOE_GATED
  reinterpret_cast<moe_bf16*>(out)[o] = moe_f32_to_bf16(v / (1.f + __expf(-v)) * u);
#else
  (void)u;
  reinterpret_cast<float*>(out)[o] = v;
#endif
}

// x [rows, MOE_K] bf16; rowidx [positions] (row of x for each position) or null (position = row);
// w0, w1 [experts, n_out, MOE_K] bf16 (w1 read only when MOE_GATED); offs [experts] group ends;
// active [>= groups]: the expert of each routed grid row (-1: none), or null (row g is expert g);
// out [positions, n_out]: bf16 when MOE_GATED, else float32. grid (n_out / MOE_ROWS, chunks + groups)
// with chunks = ceil(shared_tokens / (8 MOE_NT)) shared rows first.
// The extra group (the shared expert), when shared_tokens > 0: weights s0 (and s1 when MOE_GATED)
// [n_shared, k_shared] bf16, k_shared a multiple of 64 * MOE_KSPLIT and at most MOE_K, n_shared a
// multiple of MOE_ROWS and at most n_out; its positions shared_first .. shared_first +
// shared_tokens - 1 read token p - shared_first of x through the gather (row p without rowidx),
// in chunks of 8 * MOE_NT tokens, one per grid row before the routed ones. early != 0: the
// shared rows' blocks read x and their weights before ``pdl_wait`` (only when x was complete
// before the kernel launched just before this one, as the layer's gate/up GEMM after the
// permutation); 0: every block waits first.
extern "C" __global__ void __launch_bounds__(32 * MOE_KSPLIT)
    moe_grouped_gemm(const moe_bf16* __restrict__ x, const int* __restrict__ rowidx, const moe_bf16* __restrict__ w0,
                     const moe_bf16* __restrict__ w1, const int* __restrict__ offs, const int* __restrict__ active,
                     void* __restrict__ out, int n_out, const moe_bf16* __restrict__ s0,
                     const moe_bf16* __restrict__ s1, int n_shared, int k_shared, int shared_first,
                     int shared_tokens, int early) {
  extern __shared__ uint4 ring[];  // [MOE_KSPLIT][MOE_STAGES][MOE_NSLOT][32]
  const int chunks = (shared_tokens + 8 * MOE_NT - 1) / (8 * MOE_NT);
  const bool sh = (int)blockIdx.y < chunks;  // the shared expert's rows first: they need no routing
  const bool wait_late = sh && early;         // x was complete before the kernel before this one
  if (!wait_late) pdl_wait();
  pdl_launch_dependents();
  const int r0 = blockIdx.x * MOE_ROWS;
  int first, end, e = 0;
  if (sh) {
    first = shared_first + blockIdx.y * 8 * MOE_NT;
    end = min(first + 8 * MOE_NT, shared_first + shared_tokens);
    if (r0 >= n_shared) return;
  } else {
    e = blockIdx.y - chunks;
    if (active) e = active[e];  // the grid's routed rows cover the experts with tokens only
    if (e < 0) return;
    first = e ? offs[e - 1] : 0;
    end = offs[e];
  }
  if (first >= end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long kofs = (long long)warp * 64 + (lane & 3) * 8;
  const int ksteps = sh ? k_shared / MOE_KSTRIDE : MOE_KSTEPS;
  const moe_bf16* arow[4];
  moe_weight_rows(arow, sh, w0, w1, s0, s1, e, n_out, r0, k_shared, kofs);
  uint4* mine = ring + warp * MOE_STAGES * MOE_NSLOT * 32 + lane;
  const moe_u32 mine_s = (moe_u32)__cvta_generic_to_shared(mine);

  for (int c0 = first; c0 < end; c0 += 8 * MOE_NT) {
    const moe_bf16* brow[MOE_NT];
    int bbytes[MOE_NT];
    moe_token_rows(brow, bbytes, x, rowidx, sh, shared_first, c0, end, kofs);
    float acc[2][MOE_NT][4];
    moe_steps(acc, arow, brow, bbytes, 0, ksteps, mine, mine_s);
    if (wait_late) pdl_wait();  // the first store: the kernels before have completed
    float* red = moe_warp_partials(acc, ring);
    const int per_tile = MOE_NT * 4 * 32;
    for (int idx = threadIdx.x; idx < (MOE_GATED ? 1 : 2) * per_tile; idx += 32 * MOE_KSPLIT) {
      const int t = idx / per_tile, rest = idx % per_tile, j = rest / 128, c = (rest / 32) & 3, l = rest & 31;
      float v = 0.f, u = 0.f;
#pragma unroll
      for (int w = 0; w < MOE_KSPLIT; ++w) v += red[(w * 2 + t) * per_tile + rest];
#if MOE_GATED
#pragma unroll
      for (int w = 0; w < MOE_KSPLIT; ++w) u += red[(w * 2 + 1) * per_tile + rest];
#endif
      moe_store(out, n_out, c0 + j * 8, end, r0 + t * 16, c, l, v, u);
    }
    __syncthreads();  // the partials are read before the next chunk's copies land in the ring
  }
}

// Stream-K (MOE_NT = 1, at most 8 positions per group: the layer at up to 8 tokens, where a token
// takes an expert once). The grid of moe_grouped_gemm leaves a tail at few tokens: on one GPU of
// Kimi K2 EP8 one token's gate/up is 144 equal tiles for 132 SMs, and 12 of them stream their
// 458 KB in a second wave with the rest of the GPU idle. Here the tiles (the shared expert's
// n_shared / MOE_ROWS first, then n_out / MOE_ROWS per expert with tokens, in ``active`` order)
// are cut into block steps (MOE_KSTRIDE columns each) and laid end to end, and block b of G takes
// the steps b I / G .. (b + 1) I / G - 1 of all I: every block streams the same bytes. A tile whose
// steps fall to several blocks is summed by the last of them to finish: each writes its partial
// sums (after the warps' split-K sum) to its slot of ``ws`` [G][2][256] float32 (slot 0: its first
// tile, 1: its last), counts itself in ``cnt[tile]``, and the one that completes the count adds the
// slots in block order (a fixed order: the result does not depend on who finishes last), stores
// the outputs and puts the counter back to zero for the next launch.
// Before its pdl_wait each block prefetches its share of the shared expert's weights into L2
// (cp.async.bulk.prefetch): they are inputs, complete before the layer's first kernel ran, and HBM
// is otherwise idle while the router and the permutation finish.
// Each warp runs one cp.async pipeline over all of the block's steps, across tile boundaries (a
// pipeline drained at every tile left the SM idle for a memory latency per tile: with one or two
// blocks per SM nothing else covers it). Arguments as moe_grouped_gemm's, less ``early`` (every
// block reads x after its wait), plus ``groups`` (entries of ``active`` to scan, at most
// MOE_SK_GROUPS), ``ws`` and ``cnt`` (>= tiles int32, zero); at most MOE_SK_ROWS positions.
__device__ __forceinline__ void moe_prefetch_l2(const void* base, long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const long long per = ((bytes + gridDim.x - 1) / gridDim.x + 15) & ~15LL;  // 16-byte multiples
  const long long lo = per * blockIdx.x;
  if (lo < bytes) {
    const unsigned n = (unsigned)(bytes - lo < per ? bytes - lo : per);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<const char*>(base) + lo),
                 "r"(n)
                 : "memory");
  }
#endif
}

#if MOE_NT == 1
#define MOE_SK_GROUPS 256  // entries of active a stream-K launch may scan
#define MOE_SK_ROWS 512    // positions (routed and shared) a stream-K launch may have
extern "C" __global__ void __launch_bounds__(32 * MOE_KSPLIT)
    moe_grouped_gemm_sk(const moe_bf16* __restrict__ x, const int* __restrict__ rowidx,
                        const moe_bf16* __restrict__ w0, const moe_bf16* __restrict__ w1,
                        const int* __restrict__ offs, const int* __restrict__ active, int groups,
                        void* __restrict__ out, int n_out, const moe_bf16* __restrict__ s0,
                        const moe_bf16* __restrict__ s1, int n_shared, int k_shared, int shared_first,
                        int shared_tokens, float* __restrict__ ws, int* __restrict__ cnt) {
  // ring [MOE_KSPLIT][MOE_STAGES][MOE_NSLOT][32] uint4, then red [MOE_KSPLIT][256] and tot [256] float32
  extern __shared__ uint4 ring[];
  __shared__ int s_first[MOE_SK_GROUPS], s_end[MOE_SK_GROUPS], s_row[MOE_SK_ROWS];
  __shared__ int s_active, s_last;
  if (threadIdx.x == 0 && shared_tokens > 0) {
    moe_prefetch_l2(s0, 2LL * n_shared * k_shared);
#if MOE_GATED
    moe_prefetch_l2(s1, 2LL * n_shared * k_shared);
#endif
  }
  pdl_wait();
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nthr = 32 * MOE_KSPLIT, g = lane >> 2;
  // Each routed tile's expert and tokens, and every position's row of x, in shared memory: a
  // step's copies are issued from these without a global load in between.
  for (int a = threadIdx.x; a < groups; a += nthr) {
    const int e = active[a];
    s_first[a] = e < 0 ? 0 : (e ? offs[e - 1] : 0);
    s_end[a] = e < 0 ? 0 : offs[e];
  }
  for (int p = threadIdx.x; p < shared_first; p += nthr) s_row[p] = rowidx ? rowidx[p] : p;
  for (int p = shared_first + threadIdx.x; p < shared_first + shared_tokens; p += nthr)
    s_row[p] = rowidx ? p - shared_first : p;
  if (warp == 0) {  // experts with tokens: active holds them first, then -1
    int n = 0;
    for (int a = lane; a - lane < groups; a += 32) n += __popc(__ballot_sync(0xffffffffu, a < groups && active[a] >= 0));
    if (lane == 0) s_active = n;
  }
  __syncthreads();
  const int G = gridDim.x, b = blockIdx.x;
  const int tsh = shared_tokens > 0 ? n_shared / MOE_ROWS : 0, tpe = n_out / MOE_ROWS;
  const int kss = k_shared / MOE_KSTRIDE, ksr = MOE_KSTEPS;
  const int SH = tsh * kss, I = SH + s_active * tpe * ksr;
  auto tile_of = [&](int it) { return it < SH ? it / kss : tsh + (it - SH) / ksr; };
  auto tile_start = [&](int t) { return t < tsh ? t * kss : SH + (t - tsh) * ksr; };
  auto block_of = [&](int it) { return (int)(((long long)(it + 1) * G - 1) / I); };  // the block whose steps hold it
  const int lo = (int)((long long)b * I / G), hi = (int)((long long)(b + 1) * I / G);
  if (lo >= hi) return;
  const int first_tile = tile_of(lo);
  const long long kofs = (long long)warp * 64 + (lane & 3) * 8;
  uint4* mine = ring + warp * MOE_STAGES * MOE_NSLOT * 32 + lane;
  const moe_u32 mine_s = (moe_u32)__cvta_generic_to_shared(mine);
  float* red = reinterpret_cast<float*>(ring + MOE_KSPLIT * MOE_STAGES * MOE_NSLOT * 32);
  float* tot = red + MOE_KSPLIT * 256;
  // The tile of step it: rows r0, positions first .. end - 1 (at most 8), expert e (shared: -1).
  auto tile_info = [&](int t, int& r0, int& first, int& end, int& e) {
    if (t < tsh) {
      r0 = t * MOE_ROWS;
      first = shared_first;
      end = shared_first + shared_tokens;
      e = -1;
    } else {
      const int a = (t - tsh) / tpe;
      r0 = (t - tsh - a * tpe) * MOE_ROWS;
      first = s_first[a];
      end = s_end[a];
      e = active[a];
    }
    end = min(end, first + 8);
  };
  // One pipeline over the block's steps, across tile boundaries: the copies of the next
  // MOE_STAGES - 1 steps are in flight while a tile's sums are stored.
  auto issue = [&](int stage, int it) {
    const int t = tile_of(it), k = it - tile_start(t);
    int r0, first, end, e;
    tile_info(t, r0, first, end, e);
    const moe_bf16* arow[4];
    moe_weight_rows(arow, t < tsh, w0, w1, s0, s1, e, n_out, r0, k_shared, kofs);
    const int p = first + g;
    const moe_bf16* brow = x + (long long)(p < end ? s_row[p] : 0) * MOE_K + kofs;
    const int kk = k * MOE_KSTRIDE, bb = p < end ? 16 : 0;
    const moe_u32 dst = mine_s + stage * MOE_NSLOT * 32 * 16;
#pragma unroll
    for (int i = 0; i < MOE_NA; ++i) moe_cp_async16(dst + i * 32 * 16, arow[i >> 1] + kk + (i & 1) * 32, 16);
#pragma unroll
    for (int j = 0; j < MOE_NB; ++j) moe_cp_async16(dst + (MOE_NA + j) * 32 * 16, brow + kk + j * 32, bb);
  };
  float acc[2][4];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[t][c] = 0.f;
#pragma unroll
  for (int s = 0; s < MOE_STAGES - 1; ++s) {
    if (lo + s < hi) issue(s, lo + s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
#pragma unroll 1
  for (int it = lo; it < hi; ++it) {
    const int kn = it + MOE_STAGES - 1;
    if (kn < hi) issue((kn - lo) % MOE_STAGES, kn);
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(MOE_STAGES - 1));
    const uint4* buf = mine + ((it - lo) % MOE_STAGES) * MOE_NSLOT * 32;
    uint4 a[MOE_NA], bv[MOE_NB];
#pragma unroll
    for (int i = 0; i < MOE_NA; ++i) a[i] = buf[i * 32];
#pragma unroll
    for (int j = 0; j < MOE_NB; ++j) bv[j] = buf[(MOE_NA + j) * 32];
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int t = 0; t < 2; ++t)
        moe_mma(acc[t], moe_word(a[t * 4 + 0], a[t * 4 + 1], 2 * s), moe_word(a[t * 4 + 2], a[t * 4 + 3], 2 * s),
                moe_word(a[t * 4 + 0], a[t * 4 + 1], 2 * s + 1), moe_word(a[t * 4 + 2], a[t * 4 + 3], 2 * s + 1),
                moe_word(bv[0], bv[1], 2 * s), moe_word(bv[0], bv[1], 2 * s + 1));
    const int t = tile_of(it), t0 = tile_start(t), kt = t < tsh ? kss : ksr;
    if (it + 1 < hi && it + 1 < t0 + kt) continue;  // the tile goes on in this block
    // The tile's last step in this block: the warps' sums, then the tile's outputs.
#pragma unroll
    for (int tt = 0; tt < 2; ++tt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        red[((warp * 2 + tt) * 4 + c) * 32 + lane] = acc[tt][c];
        acc[tt][c] = 0.f;
      }
    __syncthreads();
    const int k0 = max(lo, t0) - t0, k1 = it + 1 - t0;
    const bool whole = k0 == 0 && k1 == kt;
    float* slot = ws + ((long long)b * 2 + (t == first_tile ? 0 : 1)) * 256;
    for (int idx = threadIdx.x; idx < 256; idx += nthr) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < MOE_KSPLIT; ++w) v += red[w * 256 + idx];
      if (whole) tot[idx] = v;
      else slot[idx] = v;
    }
    if (!whole) {
      __threadfence();  // the slot is visible before the count that may let another block read it
      __syncthreads();
      // counted in steps: blocks with no steps (I < G) lie between the tile's first and last
      if (threadIdx.x == 0) s_last = atomicAdd(cnt + t, k1 - k0) + (k1 - k0) == kt;
      __syncthreads();
      if (!s_last) continue;  // every thread has read red; the next tile's copies are in flight already
      __threadfence();
      const int bf = block_of(t0), bl = block_of(t0 + kt - 1);
      for (int idx = threadIdx.x; idx < 256; idx += nthr) {
        float v = 0.f;
        for (int bb = bf; bb <= bl; ++bb) {
          const int blo = (int)((long long)bb * I / G);
          if (blo == (int)((long long)(bb + 1) * I / G)) continue;  // no steps
          v += __ldcg(ws + ((long long)bb * 2 + (tile_of(blo) == t ? 0 : 1)) * 256 + idx);
        }
        tot[idx] = v;
      }
      if (threadIdx.x == 0) cnt[t] = 0;
    }
    __syncthreads();
    int r0, first, end, e;
    tile_info(t, r0, first, end, e);
    for (int idx = threadIdx.x; idx < (MOE_GATED ? 128 : 256); idx += nthr)
      moe_store(out, n_out, first, end, r0 + (idx >> 7) * 16, (idx >> 5) & 3, idx & 31, tot[idx],
                MOE_GATED ? tot[idx + 128] : 0.f);
    __syncthreads();  // red and tot are read before the next tile's sums land there
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
}
#endif

// ys [positions, dim] float32; pos [tokens * MOE_TOPK] (position or -1); weight [tokens * MOE_TOPK]
// float32; shared_first: the position of token 0's shared-expert row (token t's at shared_first +
// t, added with weight 1), or -1; out [tokens, dim] bf16. grid (tokens, column slices), dim % 4 == 0:
// block (t, c) takes columns 4 (c blockDim + threadIdx) + 4 blockDim gridDim.y j (a single token's
// 7168 columns in one block were a chain of dependent loads).
extern "C" __global__ void __launch_bounds__(256)
    moe_combine(const float* __restrict__ ys, const int* __restrict__ pos, const float* __restrict__ weight,
                int shared_first, moe_bf16* __restrict__ out, int dim) {
  pdl_wait();
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
