// verify_fused on wgmma (sm_90a), v6: an alternate-tile ping-pong of two consumer warpgroups
// (cuda/attention_pingpong.cuh), fed by a producer warpgroup through the copy engine (TMA)
// and synchronised by mbarriers only. Same function, block tile (64 rows x 64 KV rows), Q / KV
// shared-memory layout, split/partial protocol and combine as verify_fused_wgmma; one extra
// argument, the tensor map of kv viewed as a [B S, 576] bf16 matrix (box 64 rows x 64 columns,
// 128-byte swizzle: a box lands as one k-block of the K-major SW128 tile the wgmma descriptors
// read). Built with nvcc for sm_90a, empty elsewhere.
//
// 384 threads: warpgroups 0 and 1 consume, warpgroup 2 produces. setmaxnreg moves
// registers from the producer (24) to the consumers (240).
//
// Producer (one thread): tile i of the split goes to KV stage i & 1: wait until both consumers
// released the stage's previous tile (empty[i & 1], 256 arrivals), arrive on full[i & 1] with the
// tile's 73728 bytes as expected transactions, issue the 9 TMA boxes (column blocks 0..8) completing
// on it.
//
// Consumers: tile i is owned by warpgroup i & 1 (S of all 64 rows x 64 KV columns, 36 wgmma
// m64n64k16, the masked online softmax of whole rows, P into the shared P tile, the running
// max sM and the rescale sAlpha); both accumulate O += P V over their 256 value columns.
//   full[s]:  the tile in stage s has landed (the owner waits before S, the other before P V);
//   pub[w]:   warpgroup w (128 arrivals) published P, sAlpha and sM of its tile; both wait on
//             it before P V (the owner too: its own 128 threads' P stores, fenced for wgmma);
//   free[w]:  warpgroup w finished the P V of its tile, so P (single-buffered) and sAlpha may be
//             overwritten; the owner of the next tile waits before it writes them;
//   empty[s]: every consumer thread arrives after its last read of stage s (its P V of the tile).
// Every handoff inside the tile loop is an mbarrier arrive (release) / try_wait (acquire). A
// barrier never runs two phases ahead of a waiter: each next arrival on it needs, transitively,
// the waiter's wait (the model in tests/test_attention.py checks it under random interleavings).
// Named barriers remain outside those handoffs: all 256 consumer threads once Q landed and once
// before the epilogue (both warpgroups' row sums in sRed, the final sM). The owner of a partial
// last tile syncs its 128 threads after zeroing the tail rows (below) on an mbarrier of its own,
// zero[w], used at most once per block (a split has one last tile): with a named barrier there,
// that warpgroup passed one bar.sync more than the other, and compute-sanitizer's racecheck then
// reported the epilogue's sRed reads, which follow the 256-thread bar.sync that every sRed write
// precedes, as hazards (not races; perf log, v6).
//
// Rows of the last tile past the KV range end are zeroed by the tile's owner after it landed
// (TMA fills only rows outside the whole [B S] tensor with zeros; rows of later positions or
// sequences are real memory, possibly not finite, and V rows multiply P = 0): st.shared, fenced
// for the async proxy, then the owner warpgroup's zero[w] mbarrier before its S; the other warpgroup
// reads the tile after pub. Q comes in by cp.async from the consumers (rows past N H zero-filled).
#include "attention_common.cuh"
#include "attention_pingpong.cuh"
#include "attention_tile.cuh"
#include "attention_wgmma.cuh"
#include "attention_trace.cuh"

#define TMA_THREADS 384
#define TMA_PRODUCER_REGS 24
#define TMA_CONSUMER_REGS 240
#define TMA_NB_CONSUMERS 1  // named barrier: the 256 consumer threads (Q landed; epilogue)
#define TMA_BOX_BYTES (FUSED_BN * 128)  // one 64-row x 64-column box

// Shared memory: Q, two KV stages, one P tile, fp32 rows sM [BM], sAlpha [BM], sRed [2][BM], then
// ten mbarriers: full[2], empty[2], pub[2], free[2], zero[2].
#define TMA_SMEM_BYTES (FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P + 4 * FUSED_BM * 4 + 10 * 8 + 1024)
#define TMA_FULL 0
#define TMA_EMPTY 2
#define TMA_PUB 4
#define TMA_FREE 6
#define TMA_ZERO 8

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Wait for tile i in its stage; zero its rows past the KV range end (owner warpgroup wg, all 128
// threads); issue S = Q K^T into s (pp_issue_s: one wgmma group, not waited for).
__device__ __forceinline__ void tma_qk(float (&s)[8][4], att_u32 sQ, att_u32 sKV, att_u32 sBar,
                                       const FusedBlock& k, int i, int wg, int wtid, AttTrace& tr) {
  const int st = i & 1;
  const att_u32 sK = sKV + st * FUSED_SMEM_KV;
  mb_wait(sBar + 8 * (TMA_FULL + st), (i >> 1) & 1);
  att_trace_rec(tr, ATT_EV_FULL_WAIT, i);
  const int valid = k.hi - (k.lo + (k.kt0 + i) * FUSED_BN);
  if (valid < FUSED_BN) pp_zero_tail_rows(sK, valid, wtid, sBar + 8 * (TMA_ZERO + wg));
  pp_issue_s(s, sQ, sK);
  att_trace_rec(tr, ATT_EV_S_ISSUED, i);
}

// The producer thread: every tile of the split through the two-stage ring. Without EARLY, tile 1
// only once tile 0 has landed: nothing reads it before tile 0's P V, and issued together, the
// launch's blocks all queued both tiles at once, so tile 0 landed only with the whole burst (as in
// rn72, docs/perf_log.md session 39).
template <bool EARLY>
__device__ __forceinline__ void tma_produce(const AttTensorMap* map, att_u32 sKV, att_u32 sBar, const FusedBlock& k,
                                           int S, int n, AttTrace& tr) {
  tma_prefetch_map(map);
  att_trace_stamp(tr, ATT_EV_START);
  const int row0 = k.b * S + k.lo + k.kt0 * FUSED_BN;
  for (int i = 0; i < n; ++i) {
    const int st = i & 1;
    if (i >= 2) mb_wait(sBar + 8 * (TMA_EMPTY + st), ((i >> 1) - 1) & 1);  // tile i - 2 released
    if (!EARLY && i == 1) mb_wait(sBar + 8 * TMA_FULL, 0);                  // tile 0 landed
    att_trace_rec(tr, ATT_EV_EMPTY_WAIT, i);
    const att_u32 full = sBar + 8 * (TMA_FULL + st), stage = sKV + st * FUSED_SMEM_KV;
    mb_arrive_expect_tx(full, FUSED_SMEM_KV);
#pragma unroll
    for (int cb = 0; cb < ATT_D_QK / 64; ++cb)
      tma_load_2d(stage + cb * TMA_BOX_BYTES, map, full, 64 * cb, row0 + i * FUSED_BN);
    att_trace_rec(tr, ATT_EV_TMA_ISSUED, i);
  }
}

#if defined(ATT_TRACE)
// The trace's watcher (one thread of the producer warpgroup): when each tile's full barrier
// completes. It gives up on a wait that outlasts a bounded spin instead of hanging the kernel.
__device__ __forceinline__ void tma_watch(att_u32 sBar, int n, AttTrace& tr) {
  att_trace_stamp(tr, ATT_EV_START);
  for (int i = 0; i < n; ++i) {
    att_u32 done = 0;
    for (int spin = 0; spin < (1 << 22) && !done; ++spin)
      asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                   : "=r"(done) : "r"(sBar + 8 * (TMA_FULL + (i & 1))), "r"((i >> 1) & 1) : "memory");
    if (!done) return;
    att_trace_rec(tr, ATT_EV_LANDED, i);
  }
}
#endif

template <bool EARLY>
__device__ __forceinline__ void tma_body(const AttTensorMap* map, const att_bf16* __restrict__ q,
                                         const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                                         att_bf16* __restrict__ out, float* __restrict__ lse,
                                         att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B, int S,
                                         int N, int H, int W, int splits, int slot0, int mode, float scale_log2) {
  static_assert(FUSED_BM == 64 && FUSED_BN == 64 && FUSED_THREADS == 256 && ATT_D_V == 2 * 256 && ATT_D_QK == 576,
                "verify_fused_tma: 2 consumer warpgroups, 64 x 64 tiles, 256 value columns each, 9 column blocks");
  static_assert(TMA_SMEM_BYTES <= 232448, "shared memory");
  static_assert(FUSED_SMEM_KV == 9 * TMA_BOX_BYTES, "a stage is 9 boxes");
  static_assert(2 * 128 * TMA_CONSUMER_REGS + 128 * TMA_PRODUCER_REGS <= 65536, "register file");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const PpSmem m = pp_smem(smem_raw);  // mbarriers from m.sBar: full, empty, pub, free, zero [2]
  float *sM = m.sM, *sAlpha = m.sAlpha, *sRed = m.sRed;
  const att_u32 sQ = m.sQ, sKV = m.sKV, sP = m.sP, sBar = m.sBar;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wtid = tid & 127;
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode);
  const int n = k.kt1 - k.kt0;  // tiles of this split

  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mb_init(sBar + 8 * (TMA_FULL + s), 1);
      mb_init(sBar + 8 * (TMA_EMPTY + s), 256);
      mb_init(sBar + 8 * (TMA_PUB + s), 128);
      mb_init(sBar + 8 * (TMA_FREE + s), 128);
      mb_init(sBar + 8 * (TMA_ZERO + s), 128);
    }
    mb_init_fence();
  }
  if (tid < FUSED_BM) sM[tid] = ATT_NEG_INF;
  __syncthreads();  // barriers initialised, sM set

  if (wg == 2) {  // producer warpgroup
    regs_dec<TMA_PRODUCER_REGS>();
    AttTrace tr = att_trace_open(2 + (wtid >> 5), (wtid & 31) == 0 && wtid < 64);
    if (wtid == 0) tma_produce<EARLY>(map, sKV, sBar, k, S, n, tr);
#if defined(ATT_TRACE)
    if (wtid == 32) tma_watch(sBar, n, tr);
#endif
  } else {  // consumer warpgroups
    regs_inc<TMA_CONSUMER_REGS>();
    const int gid = lane >> 2, tig = lane & 3;
    const int r_lo = 16 * (warp & 3) + gid, r_hi = r_lo + 8;
    const FusedRows vr = fused_rows(vis, k, N, H, W, r_lo);
    float o[128];  // O rows r_lo (o[4 j], o[4 j + 1]) / r_hi (o[4 j + 2], o[4 j + 3]), columns 256 wg + 8 j + 2 tig
    pp_consumers_start(o, sQ, q, k, n, tid, TMA_NB_CONSUMERS);
    AttTrace tr = att_trace_open(wg, wtid == 0);
    att_trace_stamp(tr, ATT_EV_START);
    float l_lo = 0.f, l_hi = 0.f;
    const att_u64 dP = wg_desc(sP, 16, 1024);

    // S of the warpgroup's next own tile (wgmma m64n64 accumulators: n8 tile nt holds rows r_lo /
    // r_hi, KV columns 8 nt + 2 tig + {0, 1}).
    float s[8][4];
    for (int i = 0; i < n; ++i) {
      const int st = i & 1, par = (i >> 1) & 1;
      const att_u32 sK = sKV + st * FUSED_SMEM_KV;
      float al_lo, al_hi;
      if (st == wg) {
        if (!EARLY || i == 0) tma_qk(s, sQ, sKV, sBar, k, i, wg, wtid, tr);
        wg_wait_all();
        wg_pin<32>(&s[0][0]);
        att_trace_rec(tr, ATT_EV_S_DONE, i);

        float mx_lo, mx_hi;
        fused_scale_mask_max(s, k, k.lo + (k.kt0 + i) * FUSED_BN, 0, tig, vr, W, scale_log2, mx_lo, mx_hi);
        att_trace_rec(tr, ATT_EV_MASKED, i);
        if (i > 0) mb_wait(sBar + 8 * (TMA_FREE + 1 - wg), ((i - 1) >> 1) & 1);  // P(i - 1) read by the other
        att_trace_rec(tr, ATT_EV_FREE_WAIT, i);
        pp_owner_softmax(s, mx_lo, mx_hi, l_lo, l_hi, al_lo, al_hi, sM, sAlpha, sP, r_lo, r_hi, tig);
        mb_arrive(sBar + 8 * (TMA_PUB + wg));
        att_trace_rec(tr, ATT_EV_PUB, i);
        mb_wait(sBar + 8 * (TMA_PUB + wg), par);  // all of this warpgroup's P is written
        att_trace_rec(tr, ATT_EV_PUB_WAIT, i);
      } else {
        // EARLY: S of the next tile (this warpgroup's) runs while the owner of tile i finishes it.
        if (EARLY && i + 1 < n) tma_qk(s, sQ, sKV, sBar, k, i + 1, wg, wtid, tr);
        mb_wait(sBar + 8 * (TMA_PUB + st), par);  // P(i), sAlpha, sM of tile i published by its owner
        att_trace_rec(tr, ATT_EV_PUB_WAIT, i);
        mb_wait(sBar + 8 * (TMA_FULL + st), par);
        al_lo = sAlpha[r_lo];
        al_hi = sAlpha[r_hi];
        l_lo *= al_lo;
        l_hi *= al_hi;
      }
      pp_issue_pv(o, al_lo, al_hi, dP, sK, wg);
      att_trace_rec(tr, ATT_EV_PV_ISSUED, i);
      wg_wait_all();  // (EARLY: the next tile's S as well)
      wg_pin<128>(o);
      att_trace_rec(tr, ATT_EV_PV_DONE, i);
      if (EARLY) wg_pin<32>(&s[0][0]);
      if (st == wg && i + 1 < n) mb_arrive(sBar + 8 * (TMA_FREE + wg));  // P(i), sAlpha may be overwritten
      mb_arrive(sBar + 8 * (TMA_EMPTY + st));  // this thread's reads of tile i are done
      att_trace_rec(tr, ATT_EV_EMPTY, i);
    }

    pp_consumers_end(o, l_lo, l_hi, out, lse, o_part, lse_part, k, B, slot0, sRed, sM, wg, r_lo, r_hi, tig, tid,
                     TMA_NB_CONSUMERS, tr);
    att_trace_rec(tr, ATT_EV_END, n);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// EARLY = true (verify_fused_tma): a warpgroup issues S of its next tile before the O += P V of the
// other warpgroup's tile. EARLY = false (verify_fused_tma_seq, the default on sm_90): S of a tile
// only after the previous tile's O += P V. kv itself is read only
// through `map` (the argument stays for the common launch protocol).
#define TMA_ENTRY(NAME, EARLY)                                                                                 \
  extern "C" __global__ void __launch_bounds__(TMA_THREADS, 1)                                               \
      NAME(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv, const int* __restrict__ prefix_lens, \
           const long long* __restrict__ vis, att_bf16* __restrict__ out, float* __restrict__ lse,               \
           att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B, int S, int N, int H, int W,          \
           int splits, int slot0, int mode, float scale_log2, const __grid_constant__ AttTensorMap map) {       \
    TMA_BODY(EARLY)                                                                                            \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TMA_BODY(EARLY) \
  tma_body<EARLY>(&map, q, prefix_lens, vis, out, lse, o_part, lse_part, B, S, N, H, W, splits, slot0, mode, scale_log2);
#else
#define TMA_BODY(EARLY)
#endif
TMA_ENTRY(verify_fused_tma, true)
TMA_ENTRY(verify_fused_tma_seq, false)
