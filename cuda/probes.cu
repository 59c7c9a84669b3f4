// Bandwidth probes for the device ceilings (kdtree.bench.ceilings): a read-only and a
// write-only streaming kernel. 16-byte accesses, grid-stride, several loads in flight.
//
//   read_probe   reads `n` float4 of `src` `passes` times (a buffer smaller than the L2 stays
//                resident after the first pass: the L2 read ceiling; a buffer far larger than
//                the L2 streams from HBM). The sum goes to `sink` only if it equals `never`,
//                so the loads cannot be removed and nothing is written in practice.
//   write_probe  writes `value` to `n` float4 of `dst`.

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
