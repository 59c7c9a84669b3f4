// The MoE router of DeepSeek-V3 / Kimi K2 in one launch: float32 gate GEMM, sigmoid, top-k,
// renormalisation and scale.
//
// moe_router: block (expert tile, token tile). Each of the ROUTER_THREADS threads holds its
// slice of ROUTER_EB gate rows in registers (float4 j, j + 256, ... of each row: coalesced) and
// streams the tile's tokens of x (bf16) past them eight at a time, accumulating in float32
// FMAs. The 8 x ROUTER_EB partial sums of a warp are reduce-scattered with shuffles (31 for 32
// values: lane l ends with value l summed over the warp), the warps' sums added in warp order
// through shared memory, and the sigmoid written to ``scores`` [T, E] (float32 scratch). The
// order of the additions is the same for every expert, so equal gate rows give bitwise-equal
// scores. The block then bumps its token tile's counter; the block that finds every expert tile
// done (the last one) picks the top ROUTER_K of each of the tile's tokens over all E scores (one
// warp per token, E / 32 scores per lane, ROUTER_K rounds of a warp arg-max ordered by score
// descending, then expert id ascending: ties go to the lowest id), writes the renormalised,
// scaled weights and the ids, and puts the counter back to zero for the next launch.
//
// Compile-time options (-D): ROUTER_D (hidden width, a multiple of 4 x ROUTER_THREADS),
// ROUTER_E (experts, a multiple of 32 and of ROUTER_EB), ROUTER_K (experts per token, <= 32),
// ROUTER_EB (experts per block: 2 or 4). No system headers: compiles under NVRTC and nvcc.

#ifndef ROUTER_D
#define ROUTER_D 7168
#endif
#ifndef ROUTER_E
#define ROUTER_E 384
#endif
#ifndef ROUTER_K
#define ROUTER_K 8
#endif
#ifndef ROUTER_EB
#define ROUTER_EB 4
#endif
#define ROUTER_THREADS 256
#define ROUTER_WARPS (ROUTER_THREADS / 32)
#define ROUTER_G (ROUTER_D / (4 * ROUTER_THREADS))  // float4 of a gate row per thread
#define ROUTER_NV (8 * ROUTER_EB)                    // partial sums per thread: 8 tokens x ROUTER_EB experts
#define ROUTER_SPAN (ROUTER_E / 32)                  // scores per lane in the top-k

#if ROUTER_D % (4 * ROUTER_THREADS) != 0
#error "ROUTER_D must be a multiple of 1024"
#endif
#if ROUTER_EB != 2 && ROUTER_EB != 4
#error "ROUTER_EB must be 2 or 4"
#endif
#if ROUTER_E % 32 != 0 || ROUTER_E % ROUTER_EB != 0
#error "ROUTER_E must be a multiple of 32 and of ROUTER_EB"
#endif
#if ROUTER_K < 1 || ROUTER_K > 32 || ROUTER_K > ROUTER_E
#error "ROUTER_K must be in 1..min(32, ROUTER_E)"
#endif

typedef unsigned short router_bf16;
#define ROUTER_NEG_INF __int_as_float(0xff800000)

// v[0 .. 2M-1] of every lane -> v[0 .. M-1]: the half selected by bit M of the lane, plus the
// partner lane's (lane ^ M) copy of that half.
template <int M>
__device__ __forceinline__ void router_halve(float (&v)[ROUTER_NV], int lane) {
  const bool up = (lane & M) != 0;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const float send = up ? v[i] : v[i + M];
    const float keep = up ? v[i + M] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, M);
  }
}

// x [T, ROUTER_D] bf16; gate [ROUTER_E, ROUTER_D] float32; scores [T, ROUTER_E] float32 scratch;
// tiles_done [gridDim.y] int, zero before the launch and left zero after it; weight [T, ROUTER_K]
// float32 and expert [T, ROUTER_K] int64 out. grid (ROUTER_E / ROUTER_EB, ceil(T / tile)),
// block ROUTER_THREADS; ``tile`` a multiple of 8.
extern "C" __global__ void __launch_bounds__(ROUTER_THREADS, ROUTER_EB == 2 ? 2 : 1)
    moe_router(const router_bf16* __restrict__ x, const float* __restrict__ gate, float* __restrict__ scores,
               int* __restrict__ tiles_done, float* __restrict__ weight, long long* __restrict__ expert, int T,
               int tile, float scale) {
  __shared__ float red[ROUTER_WARPS][32];
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int e0 = blockIdx.x * ROUTER_EB;
  const int t0 = blockIdx.y * tile, t1 = min(T, t0 + tile);

  float4 w[ROUTER_EB][ROUTER_G];
#pragma unroll
  for (int e = 0; e < ROUTER_EB; ++e)
#pragma unroll
    for (int g = 0; g < ROUTER_G; ++g)
      w[e][g] = __ldg(reinterpret_cast<const float4*>(gate + (long long)(e0 + e) * ROUTER_D) + g * ROUTER_THREADS + tid);

  for (int tb = t0; tb < t1; tb += 8) {
    float v[ROUTER_NV];
#pragma unroll
    for (int i = 0; i < ROUTER_NV; ++i) v[i] = 0.f;
#pragma unroll
    for (int g = 0; g < ROUTER_G; ++g) {
      uint2 xr[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        xr[j] = tb + j < t1 ? __ldg(reinterpret_cast<const uint2*>(x + (long long)(tb + j) * ROUTER_D) + g * ROUTER_THREADS + tid)
                            : make_uint2(0u, 0u);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float a0 = __uint_as_float(xr[j].x << 16), a1 = __uint_as_float(xr[j].x & 0xffff0000u);
        const float a2 = __uint_as_float(xr[j].y << 16), a3 = __uint_as_float(xr[j].y & 0xffff0000u);
#pragma unroll
        for (int e = 0; e < ROUTER_EB; ++e) {
          float s = v[j * ROUTER_EB + e];
          s = fmaf(a0, w[e][g].x, s);
          s = fmaf(a1, w[e][g].y, s);
          s = fmaf(a2, w[e][g].z, s);
          s = fmaf(a3, w[e][g].w, s);
          v[j * ROUTER_EB + e] = s;
        }
      }
    }
    // With 16 values the two half-warps first add up plainly; then a reduce-scatter: at each
    // halving the lane keeps the half its bit M selects and adds the partner's copy of it.
    if constexpr (ROUTER_NV == 32) {
      router_halve<16>(v, lane);
    } else {
#pragma unroll
      for (int i = 0; i < ROUTER_NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], 16);
    }
    router_halve<8>(v, lane);
    router_halve<4>(v, lane);
    router_halve<2>(v, lane);
    router_halve<1>(v, lane);
    if (lane < ROUTER_NV) red[warp][lane] = v[0];  // lane l: value l = token l / EB, expert l % EB
    __syncthreads();
    if (tid < ROUTER_NV) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < ROUTER_WARPS; ++i) s += red[i][tid];
      const int t = tb + tid / ROUTER_EB;
      if (t < t1) scores[(long long)t * ROUTER_E + e0 + tid % ROUTER_EB] = 1.f / (1.f + expf(-s));
    }
    __syncthreads();
  }

  __threadfence();  // this block's scores reach L2 before its count does
  __syncthreads();
  if (tid == 0) last = atomicAdd(&tiles_done[blockIdx.y], 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();

  for (int t = t0 + warp; t < t1; t += ROUTER_WARPS) {
    float s[ROUTER_SPAN];
#pragma unroll
    for (int i = 0; i < ROUTER_SPAN; ++i) s[i] = __ldcg(scores + (long long)t * ROUTER_E + i * 32 + lane);
    float val[ROUTER_K];
    int idx[ROUTER_K];
#pragma unroll
    for (int r = 0; r < ROUTER_K; ++r) {
      float bv = ROUTER_NEG_INF;
      int bi = ROUTER_E;
#pragma unroll
      for (int i = 0; i < ROUTER_SPAN; ++i)  // ascending ids: a strict > keeps the lowest of equals
        if (s[i] > bv) {
          bv = s[i];
          bi = i * 32 + lane;
        }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (ov > bv || (ov == bv && oi < bi)) {
          bv = ov;
          bi = oi;
        }
      }
#pragma unroll
      for (int i = 0; i < ROUTER_SPAN; ++i)
        if (i * 32 + lane == bi) s[i] = ROUTER_NEG_INF;
      val[r] = bv;
      idx[r] = bi;
    }
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < ROUTER_K; ++r) sum += val[r];
#pragma unroll
    for (int r = 0; r < ROUTER_K; ++r)
      if (lane == r) {
        weight[(long long)t * ROUTER_K + r] = val[r] / sum * scale;
        expert[(long long)t * ROUTER_K + r] = idx[r];
      }
  }
  if (tid == 0) tiles_done[blockIdx.y] = 0;
}
