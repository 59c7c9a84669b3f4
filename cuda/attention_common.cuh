// Device helpers shared by the verify-attention kernels (cuda/verify_attention.cu).
// No system headers: the file compiles the same under NVRTC (CuPy) and nvcc.
#ifndef KDTREE_ATTENTION_COMMON_CUH
#define KDTREE_ATTENTION_COMMON_CUH

#ifndef ATT_D_QK
#define ATT_D_QK 576  // absorbed q / latent key width: 512 latent + 64 rope
#endif
#ifndef ATT_D_V
#define ATT_D_V 512   // value width: the first 512 latent values
#endif

typedef unsigned short att_bf16;  // raw bf16 bits
typedef unsigned int att_u32;
typedef unsigned long long att_u64;

#define ATT_NEG_INF (__int_as_float(0xff800000))
#define ATT_LN2 0.6931471805599453f

__device__ __forceinline__ float att_bf16_to_f32(att_bf16 h) {
  return __uint_as_float(((att_u32)h) << 16);
}

// Two floats -> packed bf16x2 (round to nearest even); lo goes to the low half.
__device__ __forceinline__ att_u32 att_pack_bf16x2(float lo, float hi) {
  att_u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 2^x; ex2.approx maps -inf to +0, which the masked softmax relies on.
__device__ __forceinline__ float att_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float att_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Is tree node j visible to the query whose visibility row is vrow (bit j of word j / 64)?
__device__ __forceinline__ bool att_visible(const long long* vrow, int j) {
  return (((att_u64)vrow[j >> 6]) >> (j & 63)) & 1ull;
}

__device__ __forceinline__ att_u32 att_smem_addr(const void* p) {
  return (att_u32)__cvta_generic_to_shared(p);
}

// 16-byte global -> shared copy; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void att_cp_async16(att_u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void att_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void att_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Orders this thread's generic-proxy shared-memory writes (st.shared, cp.async) before later
// async-proxy reads (wgmma operands); goes before the barrier that publishes them.
__device__ __forceinline__ void att_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void att_ldmatrix_x4(att_u32 addr, att_u32& r0, att_u32& r1, att_u32& r2,
                                                att_u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void att_ldmatrix_x4_trans(att_u32 addr, att_u32& r0, att_u32& r1, att_u32& r2,
                                                      att_u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D += A(16x16, row) * B(16x8, col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void att_mma_bf16(float* d, const att_u32* a, att_u32 b0, att_u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A sequence's prefix length clamped into the cache (the host validates it; the clamp only
// guarantees that no read leaves kv, e.g. under graph capture where values go unchecked).
__device__ __forceinline__ int att_prefix(const int* prefix_lens, int b, int N, int S) {
  return min(max(prefix_lens[b], 0), S - N);
}

// The KV range a pass covers: mode 0: prefix and tree [0, P + N); 1: prefix only [0, P);
// 2: tree only [P, P + N).
__device__ __forceinline__ void att_kv_range(int mode, int p, int N, int& lo, int& hi) {
  lo = (mode == 2) ? p : 0;
  hi = (mode == 1) ? p : p + N;
}

// Is absolute KV position t (inside [0, P + N)) visible to the query with visibility row vrow?
__device__ __forceinline__ bool att_kv_visible(int t, int prefix, const long long* vrow) {
  return t < prefix || att_visible(vrow, t - prefix);
}
#endif  // KDTREE_ATTENTION_COMMON_CUH
