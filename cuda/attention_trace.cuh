// An in-kernel event trace of the warp-specialised verify kernels, compiled in only with
// -DATT_TRACE (scripts/trace_attention.py); without it every call below is empty and the
// kernels' code is unchanged.
//
// ATT_TRACE_BLOCKS blocks (linear block id from ATT_TRACE_FIRST, default 0) record, per role (consumer warpgroup 0,
// consumer warpgroup 1, the producer thread, a watcher that waits on each tile's full barrier),
// up to ATT_TRACE_N events of one thread each: the SM's clock64 and (event << 32 | tile). The
// host reads `att_trace` from the module after the launch. All records of a block come from one
// SM, so their clocks compare; blocks are compared by the ATT_EV_START record's globaltimer (ns).
#ifndef KDTREE_ATTENTION_TRACE_CUH
#define KDTREE_ATTENTION_TRACE_CUH

#include "attention_common.cuh"

// Events (the tile index is the KV tile within the split; -1 where none applies).
#define ATT_EV_START 0      // role starts its tile loop (consumers: Q landed); tile field = globaltimer ns low 32 bits
#define ATT_EV_FULL_WAIT 1  // a consumer's wait on full[s] returned
#define ATT_EV_S_ISSUED 2   // S = Q K^T committed
#define ATT_EV_S_DONE 3     // S waited for (owner)
#define ATT_EV_FREE_WAIT 4  // owner: the other warpgroup finished reading the previous P
#define ATT_EV_PUB 5        // owner: P, sM, sAlpha published
#define ATT_EV_PUB_WAIT 6   // the owner's publish seen (by the other warpgroup, and by the owner's own threads)
#define ATT_EV_PV_ISSUED 7  // O += P V committed
#define ATT_EV_PV_DONE 8    // P V (and any group before it) waited for
#define ATT_EV_EMPTY 9      // this thread released the tile's stage (pair wg0: P_B V's boxes seen)
#define ATT_EV_END 10       // epilogue done
#define ATT_EV_EMPTY_WAIT 11  // producer: the stage is free for tile i (pair wg0: O rescaled for P_B V)
#define ATT_EV_TMA_ISSUED 12  // producer: tile i's boxes issued
#define ATT_EV_LANDED 13      // watcher: tile i's full barrier completed
#define ATT_EV_MASKED 14      // owner: S scaled, masked, row maxima taken
#define ATT_EV_ENTRY 15       // the thread's first instruction (pair); tile field = globaltimer ns low 32 bits
#define ATT_EV_EPI_SYNC 16    // epilogue: both warpgroups' row sums in (its block barrier passed)
#define ATT_EV_O_STORED 17    // epilogue: O's stores issued
#define ATT_EV_RESCALED 18    // rn72 warpgroup 0: the tile moved some row's shift (the full max step ran)

#if defined(ATT_TRACE)
#define ATT_TRACE_BLOCKS 8
#ifndef ATT_TRACE_FIRST
#define ATT_TRACE_FIRST 0  // the first traced block (linear id): later waves' blocks with e.g. 264
#endif
#define ATT_TRACE_N 2048
#define ATT_TRACE_ROLES 4
__device__ att_u64 att_trace[ATT_TRACE_BLOCKS * ATT_TRACE_ROLES * ATT_TRACE_N * 2];

struct AttTrace {
  att_u64* p;  // this thread's records, or null when it does not record
  int n;
};

// The recorder of `role` for the calling thread if `records` (one thread per role) and its block
// is traced; records count from the start.
__device__ __forceinline__ AttTrace att_trace_open(int role, bool records) {
  const int blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) - ATT_TRACE_FIRST;
  AttTrace t{nullptr, 0};
  if (records && blk >= 0 && blk < ATT_TRACE_BLOCKS) t.p = att_trace + ((size_t)blk * ATT_TRACE_ROLES + role) * ATT_TRACE_N * 2;
  return t;
}

__device__ __forceinline__ void att_trace_rec(AttTrace& t, int ev, int tile) {
  if (t.p != nullptr && t.n < ATT_TRACE_N - 1) {
    att_u64 clk;
    asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(clk)::"memory");
    t.p[2 * t.n] = clk;
    t.p[2 * t.n + 1] = ((att_u64)(att_u32)ev << 32) | (att_u32)tile;
    ++t.n;
  }
}

// A record whose tile field is the globaltimer (ns, low 32 bits), so blocks on different SMs can be
// lined up: START, and ENTRY at the kernel's first instruction (its clock to START is the prologue).
__device__ __forceinline__ void att_trace_stamp(AttTrace& t, int ev) {
  att_u64 ns;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns)::"memory");
  att_trace_rec(t, ev, (int)(att_u32)ns);
}
#else
struct AttTrace {};
__device__ __forceinline__ AttTrace att_trace_open(int, bool) { return AttTrace{}; }
__device__ __forceinline__ void att_trace_rec(AttTrace&, int, int) {}
__device__ __forceinline__ void att_trace_stamp(AttTrace&, int) {}
#endif  // ATT_TRACE
#endif  // KDTREE_ATTENTION_TRACE_CUH
