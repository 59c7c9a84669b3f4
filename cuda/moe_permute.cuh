// Grouping an MoE layer's (token, slot) pairs by local expert, by one block: the body of
// moe_grouped.cu's moe_permute kernel, and of the router's one finaliser at few tokens
// (moe_router_mma.cu), which groups the slots it has just chosen without a launch of its own.
//
// Counts the slots per local expert, scans them into the group ends ``offs``, and writes for
// every local slot its position in expert order (``pos``, -1 for other ranks' slots), per
// position the token it comes from (``rowidx``, 0 past the last), and the experts that have
// tokens, in ascending order (``active``, -1 past the last). The order inside an expert follows
// shared-memory atomics, so it may change from run to run; nothing downstream depends on it
// (each token's rows are computed alone and the combine sums a token's slots in slot order).
//
// No system headers: compiles under NVRTC and nvcc.

#pragma once

#define MOE_MAX_EXPERTS 1024

// expert_of(i): the global expert id of flat slot i (ids outside 0 .. experts - 1 are other
// ranks'); start: shared memory for ``experts`` ints; total: one shared int. Every thread of
// the block calls it; it ends with the outputs written, without a final barrier.
template <class ExpertOf>
__device__ __forceinline__ void moe_permute_block(ExpertOf expert_of, int slots, int k, int experts, int* start,
                                                  int* total, int* __restrict__ offs, int* __restrict__ rowidx,
                                                  int* __restrict__ pos, int* __restrict__ active) {
  const int tid = threadIdx.x, lane = tid & 31, nt = blockDim.x;
  for (int i = tid; i < experts; i += nt) start[i] = 0;
  __syncthreads();
  // Each slot's rank inside its expert (-1: another rank's); the thread's first slot keeps its
  // expert and rank in registers (the last pass then reads nothing back for it: up to 128
  // tokens of top-8 that is every slot), later ones park the rank in pos.
  int e0 = -1, r0 = -1;
  for (int i = tid; i < slots; i += nt) {
    const long long e = expert_of(i);
    const int r = (e >= 0 && e < experts) ? atomicAdd(&start[e], 1) : -1;
    if (i == tid) {
      e0 = (int)e;
      r0 = r;
    } else {
      pos[i] = r;
    }
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
    if (lane == 0) *total = carry;
    for (int i = used + lane; i < experts; i += 32) active[i] = -1;
  }
  __syncthreads();
  for (int i = tid; i < slots; i += nt) {
    const int r = i == tid ? r0 : pos[i];
    const int p = r >= 0 ? start[i == tid ? e0 : (int)expert_of(i)] + r : -1;
    pos[i] = p;
    if (p >= 0) rowidx[p] = i / k;
  }
  for (int p = *total + tid; p < slots; p += nt) rowidx[p] = 0;  // a valid row for gathers past the end
}
