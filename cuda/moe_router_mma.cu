// The MoE router of DeepSeek-V3 / Kimi K2 in one launch, on tensor cores: scores
// sigmoid(x gate^T) (x bf16, gate float32, float32 accumulation), each token's top ROUTER_K,
// renormalised weights times scale. Same semantics as moe_router.cu, for few tokens (T <= 128).
//
// The float32 gate as three bf16 terms. Each gate value g is split in registers into
// hi = bf16(g), mid = bf16(g - hi), lo = bf16(g - hi - mid) (each difference exact in float32),
// so hi + mid + lo holds g to about 2^-26 of it; x is bf16, so every product x * term is exact
// and the mma (m16n8k16, bf16 in, float32 accumulate) adds lo, mid, hi products to one float32
// accumulator: the float32 GEMM's result to float32 rounding, at tensor-core rate.
//
// Split K across blocks. Block b = (K slice s, expert tile): ROUTER_MT m-tiles of 16 experts
// (the mma's rows) x all tokens (the mma's columns, 8 per n-tile, ROUTER_NT n-tiles per pass of
// 8 * ROUTER_NT tokens) x D / ROUTER_S of the hidden width. Its ROUTER_MT x ROUTER_KW warps split
// that slice into ROUTER_KW consecutive runs of ROUTER_KSTEPS k16 steps; each warp loads its
// gate values (two float4 per lane per step) and x (one 8-byte word per lane per n-tile) straight
// from global memory into the mma fragments: within a k16 step, lane (g, q) (g = lane / 4,
// q = lane % 4) takes the physical columns k + 4q .. 4q + 3 for the mma's logical columns 2q, 2q + 1,
// 2q + 8, 2q + 9 of both operands, a permutation of the sum's terms shared by A and B. The gate
// is read once per pass; x once per expert tile (the m-tile warps of a block share it in L1).
// The ROUTER_KW warps' sums are added through shared memory in warp order, and the block writes
// its partial sums to ``part`` [ROUTER_S, T, E] (float32 scratch).
//
// Every expert's score is summed in one fixed order (k16 steps ascending with lo, mid, hi in each;
// warps ascending; K slices ascending), so equal gate rows give bitwise-equal scores.
//
// Finalisation by the last blocks. Each block, its partials written, takes a ticket from
// ``sync[0]``. The blocks with the last F = min(ceil(T / ROUTER_TF), blocks, ROUTER_FMAX)
// tickets wait until every block has its ticket (the last ticket's holder knows at once; the
// others spin on ``sync[0]``: all but at most F - 1 blocks have finished by then and the rest
// are running or will start in the slots the finished ones left, so the wait ends as long as
// the device holds more than ROUTER_FMAX blocks at once), then each takes groups of ROUTER_TF
// tokens: sums the ROUTER_S partials of each score in slice order, applies the sigmoid, and
// picks each token's top ROUTER_K over the E scores (one warp per token: keys are the scores'
// bits + 1, a warp max by redux.sync, the lowest id among the lanes holding it by a second
// redux: score descending, then expert id ascending).
// The last finaliser out (counted on ``sync[1]``; with F = 1 the one finaliser, uncounted) puts
// ``sync`` back to zero for the next launch. With ``offs`` given (T <= ROUTER_TF, so F = 1) the
// one finaliser also groups the slots it chose by local expert (cuda/moe_permute.cuh), which
// spares the layer the permutation's launch and its wait: at one token on an H200 the
// permutation's kernel ended 2 us after the router. With MOE_TRACE (cuda/moe_trace.cuh) the blocks
// also stamp their ticket and a finaliser its steps.
//
// Compile-time options (-D): ROUTER_D (hidden width, a multiple of 16 ROUTER_S ROUTER_KW),
// ROUTER_E (experts, a multiple of 32 and of 16 ROUTER_MT), ROUTER_K (experts per token, <= 32),
// ROUTER_MT (m-tiles per block), ROUTER_NT (n-tiles per pass, 1..8), ROUTER_S (K slices).
// Launched with programmatic dependent launch (cuda/pdl.cuh). No system headers: compiles under NVRTC and nvcc.

#include "moe_permute.cuh"
#include "moe_trace.cuh"
#include "pdl.cuh"

#ifndef ROUTER_D
#define ROUTER_D 7168
#endif
#ifndef ROUTER_E
#define ROUTER_E 384
#endif
#ifndef ROUTER_K
#define ROUTER_K 8
#endif
#ifndef ROUTER_MT
#define ROUTER_MT 3
#endif
#ifndef ROUTER_NT
#define ROUTER_NT 8
#endif
#ifndef ROUTER_S
#define ROUTER_S 16
#endif
#define ROUTER_KW 4
#define ROUTER_TF 4
#define ROUTER_FMAX 32
#define ROUTER_WARPS (ROUTER_MT * ROUTER_KW)
#define ROUTER_THREADS (32 * ROUTER_WARPS)
#define ROUTER_KSTEPS (ROUTER_D / (16 * ROUTER_S * ROUTER_KW))
#define ROUTER_NE (ROUTER_E / (16 * ROUTER_MT))   // expert tiles
#define ROUTER_SPAN (ROUTER_E / 32)                // scores per lane in the top-k
#define ROUTER_PER ((ROUTER_TF * ROUTER_E + ROUTER_THREADS - 1) / ROUTER_THREADS)

#if ROUTER_D % (16 * ROUTER_S * ROUTER_KW) != 0
#error "ROUTER_D must be a multiple of 16 * ROUTER_S * ROUTER_KW"
#endif
#if ROUTER_E % 32 != 0 || ROUTER_E % (16 * ROUTER_MT) != 0
#error "ROUTER_E must be a multiple of 32 and of 16 * ROUTER_MT"
#endif
#if ROUTER_K < 1 || ROUTER_K > 32 || ROUTER_K > ROUTER_E
#error "ROUTER_K must be in 1..min(32, ROUTER_E)"
#endif
#if ROUTER_NT < 1 || ROUTER_NT > 8
#error "ROUTER_NT must be in 1..8"
#endif

typedef unsigned short router_bf16;

// {lo-k value, hi-k value} rounded to nearest bf16 and packed (the lower k in the low half).
__device__ __forceinline__ unsigned router_pack(float lo_k, float hi_k) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi_k), "f"(lo_k));
  return d;
}

// (f0, f1) -> the packed bf16 pairs hi, mid, lo with f = hi + mid + lo (+ ~2^-26 f).
__device__ __forceinline__ void router_split(float f0, float f1, unsigned& hi, unsigned& mid, unsigned& lo) {
  hi = router_pack(f0, f1);
  f0 -= __uint_as_float(hi << 16);
  f1 -= __uint_as_float(hi & 0xffff0000u);
  mid = router_pack(f0, f1);
  f0 -= __uint_as_float(mid << 16);
  f1 -= __uint_as_float(mid & 0xffff0000u);
  lo = router_pack(f0, f1);
}

__device__ __forceinline__ void router_mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                           uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

__device__ __forceinline__ unsigned router_redux_max(unsigned v) {
  unsigned r;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}

__device__ __forceinline__ unsigned router_redux_min(unsigned v) {
  unsigned r;
  asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}

// x [T, ROUTER_D] bf16; gate [ROUTER_E, ROUTER_D] float32; part [ROUTER_S, T, ROUTER_E] float32
// scratch; sync [2] unsigned, zero before the launch and left zero after it; weight [T, ROUTER_K]
// float32 and expert [T, ROUTER_K] int64 out; offs, rowidx, pos, active: moe_permute_block's outputs
// over experts 0 .. n_local - 1, or null (T <= ROUTER_TF only). grid (ROUTER_S * ROUTER_NE), block
// ROUTER_THREADS.
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS, 1)
    moe_router_mma(const router_bf16* __restrict__ x, const float* __restrict__ gate, float* __restrict__ part,
                   unsigned* __restrict__ sync, float* __restrict__ weight, long long* __restrict__ expert, int T,
                   float scale, int n_local, int* __restrict__ offs, int* __restrict__ rowidx, int* __restrict__ pos,
                   int* __restrict__ active) {
  __shared__ union {
    float red[ROUTER_KW - 1][ROUTER_MT][4 * ROUTER_NT][32];  // the K-run warps' sums (main loop)
    int start[MOE_MAX_EXPERTS];                              // the permutation's (finaliser)
  } u;
  __shared__ int top_id[ROUTER_TF][ROUTER_K];
  __shared__ int total;
  __shared__ float sc[ROUTER_TF][ROUTER_E];
  __shared__ unsigned ticket;
  MoeTrace trace;
  pdl_wait();               // x comes from the kernel before (a plain launch: no-op)
  trace.waited();
  pdl_launch_dependents();  // the layer's permutation may start; it waits for this kernel
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int mt = warp % ROUTER_MT, kw = warp / ROUTER_MT;
  const int s = blockIdx.x / ROUTER_NE, et = blockIdx.x % ROUTER_NE;
  const int e0 = (et * ROUTER_MT + mt) * 16;
  const int kbase = (s * ROUTER_KW + kw) * ROUTER_KSTEPS * 16 + 4 * q;
  const float* ga = gate + (long long)(e0 + g) * ROUTER_D + kbase;
  const float* gb = ga + 8 * ROUTER_D;

  for (int p0 = 0; p0 < T; p0 += 8 * ROUTER_NT) {
    float acc[ROUTER_NT][4];
#pragma unroll
    for (int n = 0; n < ROUTER_NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
#pragma unroll
    for (int ks = 0; ks < ROUTER_KSTEPS; ++ks) {
      const float4 wa = __ldg(reinterpret_cast<const float4*>(ga + ks * 16));
      const float4 wb = __ldg(reinterpret_cast<const float4*>(gb + ks * 16));
      uint2 xb[ROUTER_NT];
#pragma unroll
      for (int n = 0; n < ROUTER_NT; ++n) {
        const int t = p0 + n * 8 + g;
        xb[n] = t < T ? __ldg(reinterpret_cast<const uint2*>(x + (long long)t * ROUTER_D + kbase + ks * 16))
                      : make_uint2(0u, 0u);
      }
      unsigned h0, m0, l0, h1, m1, l1, h2, m2, l2, h3, m3, l3;
      router_split(wa.x, wa.y, h0, m0, l0);  // row g, logical k 2q, 2q + 1
      router_split(wb.x, wb.y, h1, m1, l1);  // row g + 8
      router_split(wa.z, wa.w, h2, m2, l2);  // row g, logical k 2q + 8, 2q + 9
      router_split(wb.z, wb.w, h3, m3, l3);  // row g + 8
#pragma unroll
      for (int n = 0; n < ROUTER_NT; ++n) {
        router_mma(acc[n], l0, l1, l2, l3, xb[n]);
        router_mma(acc[n], m0, m1, m2, m3, xb[n]);
        router_mma(acc[n], h0, h1, h2, h3, xb[n]);
      }
    }
    if (kw > 0) {
#pragma unroll
      for (int n = 0; n < ROUTER_NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) u.red[kw - 1][mt][n * 4 + i][lane] = acc[n][i];
    }
    __syncthreads();
    if (kw == 0) {
#pragma unroll
      for (int n = 0; n < ROUTER_NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = acc[n][i];
#pragma unroll
          for (int w = 0; w < ROUTER_KW - 1; ++w) v += u.red[w][mt][n * 4 + i][lane];
          // c0, c1: expert e0 + g, tokens 2q, 2q + 1 of the n-tile; c2, c3: expert e0 + g + 8
          const int t = p0 + n * 8 + 2 * q + (i & 1), e = e0 + g + 8 * (i >> 1);
          if (t < T) part[((long long)s * T + t) * ROUTER_E + e] = v;
        }
    }
    __syncthreads();
  }

  if (kw == 0) __threadfence();  // the partials this thread stored reach L2 before the ticket does
  __syncthreads();
  if (tid == 0) ticket = atomicAdd(&sync[0], 1u);
  __syncthreads();
  trace.mark(0);  // ticket taken
  const int blocks = (int)gridDim.x;
  const int F = min(min((T + ROUTER_TF - 1) / ROUTER_TF, blocks), ROUTER_FMAX);
  const int f = (int)ticket - (blocks - F);
  if (f < 0) return;
  if (tid == 0) {  // the last ticket's holder knows every block has taken one: no poll
    if (ticket != (unsigned)blocks - 1)
      while (*reinterpret_cast<volatile unsigned*>(sync) < (unsigned)blocks) __nanosleep(64);
    __threadfence();  // every block's partials are visible to this block's threads after the barrier
  }
  __syncthreads();
  trace.mark(1);  // a finaliser: every ticket seen

  for (int t0 = f * ROUTER_TF; t0 < T; t0 += F * ROUTER_TF) {
#pragma unroll
    for (int j = 0; j < ROUTER_PER; ++j) {
      const int idx = j * ROUTER_THREADS + tid, i = idx / ROUTER_E, e = idx % ROUTER_E;
      if (idx < ROUTER_TF * ROUTER_E && t0 + i < T) {
        float v[ROUTER_S];
#pragma unroll
        for (int k = 0; k < ROUTER_S; ++k) v[k] = __ldcg(part + ((long long)k * T + t0 + i) * ROUTER_E + e);
        float z = v[0];
#pragma unroll
        for (int k = 1; k < ROUTER_S; ++k) z += v[k];
        sc[i][e] = 1.f / (1.f + expf(-z));
      }
    }
    __syncthreads();
    trace.mark(2);  // scores summed
    const int t = t0 + warp;
    if (warp < ROUTER_TF && t < T) {
      unsigned key[ROUTER_SPAN];  // score bits + 1 (scores are >= +0, so the order is the scores'); 0: taken
#pragma unroll
      for (int i = 0; i < ROUTER_SPAN; ++i) key[i] = __float_as_uint(sc[warp][i * 32 + lane]) + 1u;
      float val[ROUTER_K];
      int idx[ROUTER_K];
#pragma unroll
      for (int r = 0; r < ROUTER_K; ++r) {
        unsigned bk = 0u, bi = ROUTER_E;
#pragma unroll
        for (int i = 0; i < ROUTER_SPAN; ++i)  // ascending ids: a strict > keeps the lowest of equals
          if (key[i] > bk) {
            bk = key[i];
            bi = i * 32 + lane;
          }
        const unsigned best = router_redux_max(bk);
        const unsigned win = router_redux_min(bk == best ? bi : 0xffffffffu);
#pragma unroll
        for (int i = 0; i < ROUTER_SPAN; ++i)
          if ((unsigned)(i * 32 + lane) == win) key[i] = 0u;
        val[r] = __uint_as_float(best - 1u);
        idx[r] = (int)win;
      }
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < ROUTER_K; ++r) sum += val[r];
#pragma unroll
      for (int r = 0; r < ROUTER_K; ++r)
        if (lane == r) {
          weight[(long long)t * ROUTER_K + r] = val[r] / sum * scale;
          expert[(long long)t * ROUTER_K + r] = idx[r];
          top_id[warp][r] = idx[r];
        }
    }
    __syncthreads();
    trace.mark(3);  // top k written
  }
  if (offs != nullptr && F == 1)  // T <= ROUTER_TF: the tokens' slots are all in top_id
    moe_permute_block([&](int i) { return (long long)top_id[i / ROUTER_K][i % ROUTER_K]; }, T * ROUTER_K, ROUTER_K,
                      n_local, u.start, &total, offs, rowidx, pos, active);
  if (tid == 0 && (F == 1 || atomicAdd(&sync[1], 1u) == (unsigned)F - 1)) {  // the last finaliser out
    sync[0] = 0u;
    sync[1] = 0u;
  }
}
