// Bandwidth probes: a read-only and a write-only streaming kernel for the device ceilings
// (kdtree.bench.ceilings; 16-byte accesses, grid-stride, several loads in flight), and a read in
// the MoE grouped GEMM's weight pattern.
//
//   read_probe   reads `n` float4 of `src` `passes` times (a buffer smaller than the L2 stays
//                resident after the first pass: the L2 read ceiling; a buffer far larger than
//                the L2 streams from HBM). The sum goes to `sink` only if it equals `never`,
//                so the loads cannot be removed and nothing is written in practice.
//   write_probe  writes `value` to `n` float4 of `dst`.
//   rows_probe   reads a [rows, row16] matrix of 16-byte words as the MoE grouped GEMM reads its
//                weights (scripts/moe_read_probe.py): block b takes rows [b rows_per_block,
//                (b + 1) rows_per_block) and walks them in steps of PROBE_RUN16 words of every row
//                (`contiguous` = 0), or the same bytes as one contiguous range, step after step
//                (`contiguous` = 1): the same bytes per block and per step, only the addresses
//                differ. 128 threads, 8 loads each a step, four steps' loads in flight. Each
//                thread XORs the first and last 32-bit word of every 16 bytes it reads; with
//                `all` set it stores that to sink[block 128 + thread] (a test of which words
//                were read), else only where it equals `never`.

extern "C" __global__ void __launch_bounds__(256) read_probe(const float4* __restrict__ src, long long n,
                                                             int passes, float never, float* __restrict__ sink) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  float acc = 0.f;
  for (int p = 0; p < passes; ++p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      const float4 a = __ldcg(src + i), b = __ldcg(src + i + stride);
      const float4 c = __ldcg(src + i + 2 * stride), d = __ldcg(src + i + 3 * stride);
      acc += (a.x + b.y) + (c.z + d.w);
    }
    for (; i < n; i += stride) acc += __ldcg(src + i).x;
  }
  if (acc == never) sink[0] = acc;
}

extern "C" __global__ void __launch_bounds__(256) write_probe(float4* __restrict__ dst, long long n, float value) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const float4 v = make_float4(value, value, value, value);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) __stcg(dst + i, v);
}

#ifndef PROBE_RUN16
#define PROBE_RUN16 32   // 512 bytes of a row a step, as the GEMM's four K-split warps read 128 each
#endif

extern "C" __global__ void __launch_bounds__(128) rows_probe(const uint4* __restrict__ src, int row16,
                                                             int rows_per_block, int contiguous, int all,
                                                             unsigned never, unsigned* __restrict__ sink) {
  const long long base = (long long)blockIdx.x * rows_per_block * row16;
  const int per_step = rows_per_block * PROBE_RUN16, steps = row16 / PROBE_RUN16;
  unsigned acc = 0;
  for (int s0 = 0; s0 < steps; s0 += 4) {
    uint4 v[32];  // every load of four steps issued before any is used: 64 KB a block in flight
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int s = s0 + i / 8, f = (i % 8) * 128 + threadIdx.x;
      v[i] = make_uint4(0, 0, 0, 0);
      if (s < steps && f < per_step)
        v[i] = __ldcg(src + (contiguous ? base + (long long)s * per_step + f
                                        : base + (long long)(f / PROBE_RUN16) * row16 + (long long)s * PROBE_RUN16
                                              + f % PROBE_RUN16));
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) acc ^= v[i].x ^ v[i].w;
  }
  if (all) sink[blockIdx.x * 128 + threadIdx.x] = acc;
  else if (acc == never) sink[0] = acc;
}
