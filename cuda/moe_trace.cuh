// A per-block timeline of the MoE layer's kernels, compiled in only with -DMOE_TRACE
// (scripts/trace_moe.py); without it MoeTrace is empty and the kernels' code is unchanged.
//
// Thread 0 of every block (linear block id < MOE_TRACE_SLOTS) records when the block started,
// when its wait for the kernel before returned (``waited``; the start again where a block does
// not wait), and when it ended, as globaltimer nanoseconds (comparable across SMs; 32 ns steps
// on an H200) and its SM's clock64 at start and end (a finer duration), plus its SM and
// blockIdx.y, and up to MOE_TRACE_MARKS steps of a kernel's own (``mark``; 0: not reached).
// Each compiled module (each kernel and set of defines) has its own ``moe_trace`` of
// MOE_TRACE_BANKS banks (default 1). With more than one, a block writes the first bank whose
// slot for it is still empty, so after the host zeroes them consecutive layer calls fill bank
// 0, 1, ... (later calls record nothing) and the hand-off from one call to the next can be read;
// that look-up is a global load at every block's start, which delays the blocks (the T = 1 layer
// took 45.7 us traced against 40.5 with one bank), so the single-bank timeline is the accurate one.
#pragma once

#if defined(MOE_TRACE)
#define MOE_TRACE_SLOTS 16384
#ifndef MOE_TRACE_BANKS
#define MOE_TRACE_BANKS 1
#endif
#define MOE_TRACE_MARKS 4
#define MOE_TRACE_WORDS (6 + MOE_TRACE_MARKS)  // start ns, waited ns, end ns, start clock, end clock, smid | y << 16, marks ns
__device__ unsigned long long moe_trace[MOE_TRACE_BANKS * MOE_TRACE_SLOTS * MOE_TRACE_WORDS];

__device__ __forceinline__ unsigned long long moe_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t)::"memory");
  return t;
}

struct MoeTrace {
  unsigned long long* p;  // this block's record (thread 0 of a traced block), else null
  __device__ MoeTrace() : p(nullptr) {
    const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (threadIdx.x == 0 && blk < MOE_TRACE_SLOTS) {
#if MOE_TRACE_BANKS > 1
      for (int b = 0; b < MOE_TRACE_BANKS && !p; ++b) {  // the first bank this block's slot is free in
        unsigned long long* q = moe_trace + ((size_t)b * MOE_TRACE_SLOTS + blk) * MOE_TRACE_WORDS;
        if (*reinterpret_cast<volatile unsigned long long*>(q) == 0) p = q;
      }
      if (!p) return;
#else
      p = moe_trace + (size_t)blk * MOE_TRACE_WORDS;
#endif
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
      p[3] = clock64();
      p[0] = p[1] = moe_ns();
      p[5] = sm | ((unsigned long long)blockIdx.y << 16);
      for (int i = 0; i < MOE_TRACE_MARKS; ++i) p[6 + i] = 0;
    }
  }
  __device__ void mark(int i) {
    if (p) p[6 + i] = moe_ns();
  }
  __device__ void waited() {
    if (p) p[1] = moe_ns();
  }
  __device__ ~MoeTrace() {
    if (p) {
      p[4] = clock64();
      p[2] = moe_ns();
    }
  }
};
#else
struct MoeTrace {
  __device__ void waited() {}
  __device__ void mark(int) {}
};
#endif
