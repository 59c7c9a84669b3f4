// wgmma (sm_90a) building blocks of the verify-attention kernels: shared-memory matrix
// descriptors, fences, and the m64nNk16 bf16 instructions they issue. Compiled only for
// sm_90a (nvcc); other targets see nothing of it.
#ifndef KDTREE_ATTENTION_WGMMA_CUH
#define KDTREE_ATTENTION_WGMMA_CUH

#include "attention_common.cuh"

// The 128-byte tensor map (CUtensorMap) a host encoded, passed by value as a __grid_constant__
// kernel parameter; its generic address is what the copy engine reads.
struct __align__(64) AttTensorMap {
  att_u64 w[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor: start address, leading / stride byte offsets, 128B swizzle.
// K-major operands: SBO = 1024 (8 rows of 128 B), LBO unused. MN-major operands: LBO = bytes
// between 64-element blocks along M/N, SBO = 1024 between 8-row groups along K.
__device__ __forceinline__ att_u64 wg_desc(att_u32 addr, att_u32 lbo, att_u32 sbo) {
  return (att_u64)((addr & 0x3FFFF) >> 4) | ((att_u64)((lbo >> 4) & 0x3FFF) << 16) |
         ((att_u64)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// The descriptor of the operand `bytes` (a multiple of 16) past d's start: bytes / 16 added to the
// start-address field (bits 0-13). No carry leaves the field while the address stays under the
// 256 KB it spans (shared memory is at most 228 KB). One add, where a descriptor built per k-step
// costs five instructions: a kernel's first wave fetches its code cold from HBM, and the k-steps
// of S were most of the pair kernel's loop (scripts/code_size.py).
__device__ __forceinline__ att_u64 wg_desc_add(att_u64 d, att_u32 bytes) { return d + (bytes >> 4); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keeps the compiler from touching accumulator registers across wgmma.wait / wgmma.fence.
template <int COUNT>
__device__ __forceinline__ void wg_pin(float* r) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D[64 x NW] += A[64 x 16] B[16 x NW] with NW / 2 fp32 accumulators per thread (D = A B when acc
// is 0: no register is written before the first k-step of a chain); B K-major in shared memory, A
// K-major (TA = 0) or MN-major (TA = 1, transposed) in shared memory.
template <int NW, int TA>
__device__ __forceinline__ void wg_mma(float* d, att_u64 da, att_u64 db, int acc = 1);

#define WG_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_R4 "%0,%1,%2,%3"
#define WG_R8 WG_R4 ",%4,%5,%6,%7"
#define WG_R12 WG_R8 ",%8,%9,%10,%11"
#define WG_R16 WG_R12 ",%12,%13,%14,%15"
#define WG_R32 WG_R16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_R36 WG_R32 ",%32,%33,%34,%35"
#define WG_MMA_DEF(NW, TA, REGS, IA, IB, IP, ...)                                                       \
  template <>                                                                                          \
  __device__ __forceinline__ void wg_mma<NW, TA>(float* d, att_u64 da, att_u64 db, int acc) {           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned.m64n" #NW "k16.f32.bf16.bf16 {" REGS "}, %" #IA ", %" #IB \
                 ", p, 1, 1, " #TA ", 0;\n}\n"                                                         \
                 : __VA_ARGS__                                                                         \
                 : "l"(da), "l"(db), "r"(acc));                                                        \
  }
WG_MMA_DEF(8, 0, WG_R4, 4, 5, 6, WG_D4(0))
WG_MMA_DEF(8, 1, WG_R4, 4, 5, 6, WG_D4(0))
WG_MMA_DEF(16, 0, WG_R8, 8, 9, 10, WG_D4(0), WG_D4(4))
WG_MMA_DEF(16, 1, WG_R8, 8, 9, 10, WG_D4(0), WG_D4(4))
WG_MMA_DEF(24, 0, WG_R12, 12, 13, 14, WG_D4(0), WG_D4(4), WG_D4(8))
WG_MMA_DEF(24, 1, WG_R12, 12, 13, 14, WG_D4(0), WG_D4(4), WG_D4(8))
WG_MMA_DEF(32, 0, WG_R16, 16, 17, 18, WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12))
WG_MMA_DEF(32, 1, WG_R16, 16, 17, 18, WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12))
WG_MMA_DEF(64, 0, WG_R32, 32, 33, 34, WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12), WG_D4(16), WG_D4(20), WG_D4(24),
           WG_D4(28))
WG_MMA_DEF(64, 1, WG_R32, 32, 33, 34, WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12), WG_D4(16), WG_D4(20), WG_D4(24),
           WG_D4(28))
// N = 72: the rows of one H = 8, N = 9 sequence on wgmma's N (the rows_n layout, wgmma_probe.cu).
WG_MMA_DEF(72, 0, WG_R36, 36, 37, 38, WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12), WG_D4(16), WG_D4(20), WG_D4(24),
           WG_D4(28), WG_D4(32))
WG_MMA_DEF(72, 1, WG_R36, 36, 37, 38, WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12), WG_D4(16), WG_D4(20), WG_D4(24),
           WG_D4(28), WG_D4(32))
#undef WG_MMA_DEF

// The 128 accumulators of an m64n256 wgmma: operands %0 .. %127.
#define WG_R128                                                                        \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                             \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                   \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                   \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                   \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                   \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                   \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"       \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_D128                                                                                               \
  WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12), WG_D4(16), WG_D4(20), WG_D4(24), WG_D4(28), WG_D4(32), WG_D4(36),   \
      WG_D4(40), WG_D4(44), WG_D4(48), WG_D4(52), WG_D4(56), WG_D4(60), WG_D4(64), WG_D4(68), WG_D4(72),       \
      WG_D4(76), WG_D4(80), WG_D4(84), WG_D4(88), WG_D4(92), WG_D4(96), WG_D4(100), WG_D4(104), WG_D4(108),    \
      WG_D4(112), WG_D4(116), WG_D4(120), WG_D4(124)

// D[64 x 256] += A[64 x 16] B[16 x 256], A K-major and B MN-major (transposed) in shared memory.
__device__ __forceinline__ void wg_m64n256k16_tb(float* d, att_u64 da, att_u64 db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_R128 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
               : WG_D128
               : "l"(da), "l"(db), "r"(1));
}
// The same with A from registers (RS, the m16n8k16 A fragment per warp, as wg_mma64_rs below).
__device__ __forceinline__ void wg_m64n256k16_rs_tb(float* d, const att_u32 (&a)[4], att_u64 db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_R128
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
               : WG_D128
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// D[64 x 64] += A[64 x 16] B[16 x 64] with A from registers (RS): each warp's 16 rows in the
// m16n8k16 A fragment (a[0]: row gid, columns 2 tig, 2 tig + 1; a[1]: row gid + 8; a[2], a[3]: the
// same rows, columns + 8; bf16 pairs), B K-major in shared memory.
__device__ __forceinline__ void wg_mma64_rs(float* d, const att_u32 (&a)[4], att_u64 db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_R32 "}, {%32, %33, %34, %35}, %36, p, 1, "
               "1, 0;\n}\n"
               : WG_D4(0), WG_D4(4), WG_D4(8), WG_D4(12), WG_D4(16), WG_D4(20), WG_D4(24), WG_D4(28)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#undef WG_D128
#undef WG_R128
#undef WG_D4
#undef WG_R4
#undef WG_R8
#undef WG_R12
#undef WG_R16
#undef WG_R32
#undef WG_R36

// mbarrier (shared::cta) and named-barrier primitives of the warp-specialised kernels.
__device__ __forceinline__ void mb_init(att_u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Wait until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mb_wait(att_u32 bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Named barrier `id` over `count` threads: wait for all of them.
__device__ __forceinline__ void nb_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The TMA / mbarrier-ring primitives of the v6 kernel (verify_attention_tma.cu).
// Makes barrier initialisation visible to the async proxy (the copy engine's complete_tx).
__device__ __forceinline__ void mb_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Arrive on `bar` (release, CTA scope) without waiting.
__device__ __forceinline__ void mb_arrive(att_u32 bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrive on `bar` and add `bytes` to the transaction count its current phase waits for.
__device__ __forceinline__ void mb_arrive_expect_tx(att_u32 bar, att_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const AttTensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<att_u64>(map)) : "memory");
}
// Copy engine: the box at (column x, row y) of a 2D tensor map into shared memory at dst, laid out
// with the map's swizzle (elements outside the tensor read as zero); its bytes count toward the
// transaction count of mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(att_u32 dst, const AttTensorMap* map, att_u32 bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<att_u64>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// Copy engine: shared memory at src (laid out with the map's swizzle) written to the box at (column
// x, row y, matrix z) of a 3D tensor map; elements outside the tensor are not written. Part of
// this thread's open bulk group (tma_store_commit_wait_read).
__device__ __forceinline__ void tma_store_3d(const AttTensorMap* map, att_u32 src, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
               ::"l"(reinterpret_cast<att_u64>(map)), "r"(x), "r"(y), "r"(z), "r"(src) : "memory");
}
// Close this thread's bulk group and wait until its stores have read their shared memory (which
// may then be reused, or the block end; the global writes complete on their own).
__device__ __forceinline__ void tma_store_commit_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Register budget of the calling warpgroup (all its threads, a multiple of 8 in 24..256).
template <int REGS>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
#endif  // KDTREE_ATTENTION_WGMMA_CUH
