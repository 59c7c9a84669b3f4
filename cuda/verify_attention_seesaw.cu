// verify_fused on wgmma (sm_90a), v7 "seesaw": v6's warpgroups, tile and TMA producer
// (cuda/verify_attention_tma.cu) under a schedule that waits for less. Same function, block tile
// (64 rows x 64 KV rows), Q / KV shared-memory layout, split/partial protocol, combine and kv
// tensor map (box 64 rows x 64 columns, 128-byte swizzle) as verify_fused_tma. Built with nvcc for
// sm_90a, empty elsewhere.
//
// 384 threads: warpgroups 0 and 1 consume, warpgroup 2 produces (setmaxnreg: 24 / 240). Tile i of
// the split lives in KV stage i & 1 and is owned by consumer warpgroup i & 1 (S of all 64 rows x 64
// KV columns, the masked online softmax, P into the shared P tile, sM, sAlpha); both accumulate
// O += P V over their own 256 value columns. Half h of a stage is what warpgroup h's P V reads:
// column blocks (boxes) 4h .. 4h + 3, and for h = 1 also the rope block 8 (read by S only).
//
// Against v6:
//   full[s][b]:  one mbarrier per box (expect_tx 8192 B each): the non-owner's P V waits for
//                its half's boxes only; S waits for all nine, then issues its k-steps as one
//                stream (v7.2; v7.1 issued each box's k-steps as soon as that box landed, a
//                wait and a fence between every four wgmmas, 1.18-1.26x slower than tma);
//   empty[s][h]: one per stage half (128 arrivals, the threads of warpgroup h after its P V of
//                the tile). Two producer threads, one per half, each refill their half as soon as
//                it is released, not after both P Vs;
//   order:       the non-owner of tile i issues S(i + 1) (its own next tile) before it waits for
//                tile i's P, so S(i + 1) runs under the owner's softmax of tile i (as v6), then
//                P V(i), and waits for both before it releases its half. (The first v7 issued
//                P V(i) first and S(i + 1) behind it, so that P V(i) would not wait for S(i + 1);
//                that put every S after the other warpgroup's publish, serialising each softmax
//                with the next S: 1.29-1.41x slower than tma on an H200, docs/perf_log.md.)
//   softmax:     the owner exponentiates and publishes sM / sAlpha before it waits for free (the
//                other warpgroup's P V of the previous tile); only the P stores wait.
// Handoffs, all mbarrier arrive (release) / try_wait (acquire): pub[w] (warpgroup w published P,
// sAlpha, sM of its tile; both wait before P V), free[w] (warpgroup w finished the P V of its tile,
// P may be overwritten), zero[w] (the owner of a partial last tile zeroed its rows past the KV range
// end, as v6). Why each overwrite is safe: P(i + 1) is written by the owner of i + 1 after free of
// the owner of i and after its own P V(i) (its wait_group 0 after P V(i)); sAlpha(i + 1)
// and sM(i + 1) are read by the owner of i + 1 itself (sM) and the owner of i (sAlpha), which
// reads them only after pub(i + 1), and the owner of i + 1 read sAlpha(i) and sM(i) in program order
// before. A refilled half was released by every wgmma that reads it: its P V (empty), and S, which
// completed before the owner's pub that the non-owner's P V waits for. tests/test_attention.py
// models the protocol under random interleavings. Not here: the owner's P V with P from registers
// and a second P buffer (they need Q's rope block out of shared memory to fit).
#include "attention_common.cuh"
#include "attention_pingpong.cuh"
#include "attention_tile.cuh"
#include "attention_wgmma.cuh"

#define SEE_THREADS 384
#define SEE_PRODUCER_REGS 24
#define SEE_CONSUMER_REGS 240
#define SEE_NB_CONSUMERS 1  // named barrier: the 256 consumer threads (Q landed; epilogue)
#define SEE_BOXES (ATT_D_QK / 64)
#define SEE_BOX_BYTES (FUSED_BN * 128)  // one 64-row x 64-column box

// Shared memory: Q, two KV stages, one P tile, fp32 rows sM [BM], sAlpha [BM], sRed [2][BM], then
// the mbarriers: full[2][9], empty[2][2], pub[2], free[2], zero[2].
#define SEE_FULL 0
#define SEE_EMPTY (2 * SEE_BOXES)
#define SEE_PUB (SEE_EMPTY + 4)
#define SEE_FREE (SEE_PUB + 2)
#define SEE_ZERO (SEE_FREE + 2)
#define SEE_NBARS (SEE_ZERO + 2)
#define SEE_SMEM_BYTES (FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P + 4 * FUSED_BM * 4 + SEE_NBARS * 8 + 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The owner (warpgroup wg, all 128 threads) of a partial last tile i: every box landed, its rows
// past the KV range end zeroed (st.shared, fenced for the async proxy, then zero[wg]). Called
// before any wgmma group is in flight (the zeroing loop diverges).
__device__ __forceinline__ void see_zero_tail(att_u32 sKV, att_u32 sBar, const FusedBlock& k, int i, int wg,
                                              int wtid) {
  const int st = i & 1;
  const int valid = k.hi - (k.lo + (k.kt0 + i) * FUSED_BN);
  if (valid >= FUSED_BN) return;
  const att_u32 sK = sKV + st * FUSED_SMEM_KV;
  for (int cb = 0; cb < SEE_BOXES; ++cb) mb_wait(sBar + 8 * (SEE_FULL + SEE_BOXES * st + cb), (i >> 1) & 1);
  pp_zero_tail_rows(sK, valid, wtid, sBar + 8 * (SEE_ZERO + wg));
}

// Issue S = Q K^T of tile i as one wgmma group, not waited for: the k-steps of box cb after
// full[i & 1][cb].
__device__ __forceinline__ void see_issue_s(float (&s)[8][4], att_u32 sQ, att_u32 sKV, att_u32 sBar, int i) {
  const int st = i & 1, par = (i >> 1) & 1;
  const att_u32 full = sBar + 8 * (SEE_FULL + SEE_BOXES * st);
  // Descriptors advance by (byte offset >> 4) in their address field (shared addresses < 2^18).
  const att_u64 dQ = wg_desc(sQ, 16, 1024), dK = wg_desc(sKV + st * FUSED_SMEM_KV, 16, 1024);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
  wg_pin<32>(&s[0][0]);
  // Every box first, then one fence and the 36 k-steps as one stream (v7.2: v7.1 waited box by
  // box with a fence after each wait, and ran 1.18-1.26x slower than tma).
  for (int cb = 0; cb < SEE_BOXES; ++cb) mb_wait(full + 8 * cb, par);
  wg_fence();  // after the waits' branches: ptxas would insert its own, serialising the wgmmas (C7520)
#pragma unroll
  for (int cb = 0; cb < SEE_BOXES; ++cb) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const att_u32 off = cb * 128 * FUSED_BN + kk * 32;
      wg_mma<64, 0>(&s[0][0], dQ + (off >> 4), dK + (off >> 4));
    }
  }
  wg_commit();
}

// One producer thread per stage half H: tile i's boxes of half H into stage i & 1 once warpgroup H
// released the half's previous tile (empty[st][H]), each box completing on its own full barrier.
// row0: the [B S] row of the split's first tile.
template <int H>
__device__ __forceinline__ void see_produce(const AttTensorMap* map, att_u32 sKV, att_u32 sBar, int row0, int n) {
  tma_prefetch_map(map);
  for (int i = 0; i < n; ++i) {
    const int st = i & 1;
    if (i >= 2) mb_wait(sBar + 8 * (SEE_EMPTY + 2 * st + H), ((i >> 1) - 1) & 1);  // tile i - 2's half released
#pragma unroll
    for (int cb = 4 * H; cb < (H == 0 ? 4 : SEE_BOXES); ++cb) {
      const att_u32 full = sBar + 8 * (SEE_FULL + SEE_BOXES * st + cb);
      mb_arrive_expect_tx(full, SEE_BOX_BYTES);
      tma_load_2d(sKV + st * FUSED_SMEM_KV + cb * SEE_BOX_BYTES, map, full, 64 * cb, row0 + i * FUSED_BN);
    }
  }
}

// The owner's online-softmax step in registers (p = 2^(s - m) in s), then the new running max and
// row rescale into sM / sAlpha (by each quad's tig-0 thread); P is stored later (fused_store_p).
__device__ __forceinline__ void see_softmax(float (&s)[8][4], float mx_lo, float mx_hi, float& l_lo, float& l_hi,
                                            float& al_lo, float& al_hi, float* sM, float* sAlpha, int r_lo, int r_hi,
                                            int tig) {
  float m_lo = sM[r_lo], m_hi = sM[r_hi];
  al_lo = fused_softmax_row<0>(s, mx_lo, m_lo, l_lo);
  al_hi = fused_softmax_row<2>(s, mx_hi, m_hi, l_hi);
  pp_publish_stats(sM, sAlpha, m_lo, m_hi, al_lo, al_hi, r_lo, r_hi, tig);
}

template <bool B>
struct SeeRole {
  static constexpr bool value = B;
};

// The tile loop of consumer warpgroup WG (a template, so that no role branch depends on the thread
// index: ptxas serialises wgmmas whose accumulators are in flight across a branch it must treat as
// divergent, C7518). o, l_lo, l_hi: this warpgroup's O rows and partial row sums.
template <int WG>
__device__ __forceinline__ void see_tiles(float (&o)[128], float& l_lo, float& l_hi, att_u32 sQ, att_u32 sKV,
                                          att_u32 sP, att_u32 sBar, float* sM, float* sAlpha, const FusedBlock& k,
                                          int n, const long long* v_lo, const long long* v_hi, int W, float scale_log2,
                                          int r_lo, int r_hi, int tig, int wtid) {
  const att_u64 dP = wg_desc(sP, 16, 1024);
  // S of the warpgroup's next own tile (wgmma m64n64 accumulators: n8 tile nt holds rows r_lo /
  // r_hi, KV columns 8 nt + 2 tig + {0, 1}); tile 0's is issued here, tile i + 1's by its owner
  // right after the P V of tile i.
  float s[8][4];
  if (WG == 0 && n > 0) {
    see_zero_tail(sKV, sBar, k, 0, WG, wtid);
    see_issue_s(s, sQ, sKV, sBar, 0);
  }
  // One tile step; OWNER (st == WG) is a compile-time role. The loop runs over the warpgroup's own
  // tiles, each followed by the other warpgroup's next one, so every path into an owner step may
  // carry S in flight and every path into a non-owner step carries none (ptxas must see both on
  // every path, possible or not, or it serialises the wgmmas, C7518).
  auto step = [&](auto role, int i) {
    constexpr bool OWNER = decltype(role)::value;
    const int st = i & 1, par = (i >> 1) & 1;
    const att_u32 sK = sKV + st * FUSED_SMEM_KV;
    const att_u32 empty = sBar + 8 * (SEE_EMPTY + 2 * st + WG);
    if (OWNER) {
      wg_wait<0>();  // S(i) (the last group this warpgroup issued)
      wg_pin<32>(&s[0][0]);
      float mx_lo, mx_hi, al_lo, al_hi;
      fused_scale_mask_max(s, k, k.lo + (k.kt0 + i) * FUSED_BN, 0, tig, v_lo, v_hi, W, scale_log2, mx_lo, mx_hi);
      see_softmax(s, mx_lo, mx_hi, l_lo, l_hi, al_lo, al_hi, sM, sAlpha, r_lo, r_hi, tig);
      if (i > 0) mb_wait(sBar + 8 * (SEE_FREE + 1 - WG), ((i - 1) >> 1) & 1);  // P(i - 1) read by the other
      fused_store_p(s, sP, r_lo, r_hi, 0, tig);
      att_fence_proxy_async();  // P, visible to wgmma
      mb_arrive(sBar + 8 * (SEE_PUB + WG));
      mb_wait(sBar + 8 * (SEE_PUB + WG), par);  // all of this warpgroup's P is written
      pp_issue_pv<false>(o, al_lo, al_hi, dP, sK, WG);
      wg_wait<0>();
      wg_pin<128>(o);
      if (i + 1 < n) mb_arrive(sBar + 8 * (SEE_FREE + WG));  // P(i) may be overwritten
      mb_arrive(empty);  // half WG of stage st may be refilled
    } else {
      if (i + 1 < n) {  // own next tile first: S(i + 1) runs under the owner's softmax of tile i
        see_zero_tail(sKV, sBar, k, i + 1, WG, wtid);
        see_issue_s(s, sQ, sKV, sBar, i + 1);
      }
      mb_wait(sBar + 8 * (SEE_PUB + st), par);  // P(i), sAlpha, sM of tile i published by its owner
      for (int cb = 4 * WG; cb < 4 * WG + 4; ++cb) mb_wait(sBar + 8 * (SEE_FULL + SEE_BOXES * st + cb), par);
      const float al_lo = sAlpha[r_lo], al_hi = sAlpha[r_hi];
      l_lo *= al_lo;
      l_hi *= al_hi;
      pp_issue_pv<false>(o, al_lo, al_hi, dP, sK, WG);
      wg_wait<0>();  // S(i + 1) and P V(i) complete
      wg_pin<128>(o);
      mb_arrive(empty);
    }
  };
  if (WG == 1 && n > 0) step(SeeRole<false>(), 0);
  for (int i = WG; i < n; i += 2) {
    step(SeeRole<true>(), i);
    if (i + 1 < n) step(SeeRole<false>(), i + 1);
  }
  wg_wait<0>();  // nothing is pending here; without it ptxas guards the S registers on every exit path (C7518)
}

__device__ __forceinline__ void see_body(const AttTensorMap* map, const att_bf16* __restrict__ q,
                                         const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                                         att_bf16* __restrict__ out, float* __restrict__ lse,
                                         float* __restrict__ o_part, float* __restrict__ lse_part, int B, int S, int N,
                                         int H, int W, int splits, int slot0, int mode, float scale_log2) {
  static_assert(FUSED_BM == 64 && FUSED_BN == 64 && ATT_D_V == 2 * 256 && ATT_D_QK == 576,
                "verify_fused_seesaw: 2 consumer warpgroups, 64 x 64 tiles, 256 value columns each, 9 boxes");
  static_assert(SEE_SMEM_BYTES <= 232448, "shared memory");
  static_assert(FUSED_SMEM_KV == SEE_BOXES * SEE_BOX_BYTES, "a stage is 9 boxes");
  static_assert(2 * 128 * SEE_CONSUMER_REGS + 128 * SEE_PRODUCER_REGS <= 65536, "register file");
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode);
  const int n = k.kt1 - k.kt0;  // tiles of this split
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wtid = tid & 127;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const PpSmem m = pp_smem(smem_raw);  // SEE_NBARS mbarriers from m.sBar
  float *sM = m.sM, *sAlpha = m.sAlpha, *sRed = m.sRed;
  const att_u32 sQ = m.sQ, sKV = m.sKV, sP = m.sP, sBar = m.sBar;

  if (tid == 0) {
    for (int b = 0; b < 2 * SEE_BOXES; ++b) mb_init(sBar + 8 * (SEE_FULL + b), 1);
    for (int b = 0; b < 4; ++b) mb_init(sBar + 8 * (SEE_EMPTY + b), 128);
    for (int b = SEE_PUB; b < SEE_NBARS; ++b) mb_init(sBar + 8 * b, 128);
    mb_init_fence();
  }
  if (tid < FUSED_BM) sM[tid] = ATT_NEG_INF;
  __syncthreads();  // barriers initialised, sM set

  const int row0 = k.b * S + k.lo + k.kt0 * FUSED_BN;  // the producers' first row (before setmaxnreg)
  if (wg == 2) {  // producer warpgroup: lane 0 of warp 0 refills half 0, lane 0 of warp 1 half 1
    regs_dec<SEE_PRODUCER_REGS>();
    if (wtid == 0) see_produce<0>(map, sKV, sBar, row0, n);
    if (wtid == 32) see_produce<1>(map, sKV, sBar, row0, n);
  } else {  // consumer warpgroups
    regs_inc<SEE_CONSUMER_REGS>();
    const int gid = lane >> 2, tig = lane & 3;
    const int r_lo = 16 * (warp & 3) + gid, r_hi = r_lo + 8;
    float o[128];  // O rows r_lo (o[4 j], o[4 j + 1]) / r_hi (o[4 j + 2], o[4 j + 3]), columns 256 wg + 8 j + 2 tig
    pp_consumers_start(o, sQ, q, k, n, tid, SEE_NB_CONSUMERS);
    float l_lo = 0.f, l_hi = 0.f;
    const long long* v_lo = fused_vis_row(vis, k, N, H, W, r_lo);  // the rows' visibility (masks)
    const long long* v_hi = fused_vis_row(vis, k, N, H, W, r_hi);
    if (wg == 0)
      see_tiles<0>(o, l_lo, l_hi, sQ, sKV, sP, sBar, sM, sAlpha, k, n, v_lo, v_hi, W, scale_log2, r_lo, r_hi, tig, wtid);
    else
      see_tiles<1>(o, l_lo, l_hi, sQ, sKV, sP, sBar, sM, sAlpha, k, n, v_lo, v_hi, W, scale_log2, r_lo, r_hi, tig, wtid);

    pp_consumers_end(o, l_lo, l_hi, out, lse, o_part, lse_part, k, B, slot0, sRed, sM, wg, r_lo, r_hi, tig, tid,
                     SEE_NB_CONSUMERS);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// kv itself is read only through `map` (the argument stays for the common launch protocol).
extern "C" __global__ void __launch_bounds__(SEE_THREADS, 1)
    verify_fused_seesaw(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                        const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                        att_bf16* __restrict__ out, float* __restrict__ lse, float* __restrict__ o_part,
                        float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, int slot0,
                        int mode, float scale_log2, const __grid_constant__ AttTensorMap map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  see_body(&map, q, prefix_lens, vis, out, lse, o_part, lse_part, B, S, N, H, W, splits, slot0, mode, scale_log2);
#endif
}
