// verify_fused_pair on wgmma (sm_90a), v10: KV tiles taken in pairs by two warpgroups that trade
// halves of the work, so that each warpgroup's softmax runs while the tensor cores do the other's
// matrix products. Same function, block tile (64 rows x 64 KV rows), Q / KV shared-memory layout,
// split/partial protocol, combine and tensor-map argument as verify_fused_tma
// (verify_attention_tma.cu); 256 threads, no producer warpgroup.
//
// Tiles 2 j (A, KV stage 0) and 2 j + 1 (B, stage 1) form pair j. Warpgroup 0 computes S of A,
// warpgroup 1 S of B; warpgroup g accumulates O over value columns 256 g .. +255 for both tiles.
// Per pair:
//   wg0: the max of S_A against the running max m -> m_A, alpha_A (sM, sScale0; SCALE0), then
//        the exponentials of P_A (wg1's softmax of B needs m_A only, not P_A);
//        O0 = O0 alpha_A + P_A V_A[:, 0:256] with P_A from registers (RS wgmma);
//        waits SCALE1 for alpha_B, stores P_A alpha_B (P_A against m_B) into sP0 (P0);
//        waits P1; O0 = O0 alpha_B + P_B V_B[:, 0:256] with P_B from sP1; issues S of the next A.
//   wg1: waits SCALE0; the max of S_B against m_A -> m_B, alpha_B (sM, sScale1; SCALE1), then
//        the exponentials of P_B (wg0 scales P_A on alpha_B meanwhile); stores P_B into sP1 (P1);
//        O1 = O1 alpha_A alpha_B + P_B V_B[:, 256:512] from registers; waits P0;
//        O1 += P_A alpha_B V_A[:, 256:512] from sP0; issues S of the next B.
// Both halves of O and both row sums (wg0 sums P_A, wg1 P_B, each rescaled like its O) end on the
// same final max. A pair without B (odd tile count) ends after P_A (unscaled) and alpha_A.
//
// Loads: the copy engine (TMA) lands each 64-column box of a tile on its own mbarrier (full[s][b],
// 8 KB expected), so S starts on the first boxes to land. A stage's boxes are refilled by the
// warpgroup whose reads of them end last: wg0 loads boxes 0-3 (V's first half) of the next A once
// its P_A V_A is done, and of the next B once its P_B V_B is done (wg1's S_B is done: SCALE1);
// wg1 loads boxes 4-8 (V's second half and the rope box) of the next B and the next A once its two
// P V are done (wg0's S_A is done: SCALE0). wg0 walks the boxes of S in the order 0..8, wg1 in
// 4..8, 0..3: first the boxes its own loads brought. Every other handoff is an mbarrier of 128
// arrivals per pair (SCALE0, SCALE1, P0, P1); the arrivals of a pair each need, transitively, the
// waits of the pair before, so no barrier runs two phases ahead of a waiter.
//
// Q comes with the copy engine too (`qmap`, issued before KV tiles 0 and 1 on its own mbarrier,
// QFULL): the boxes of a last row tile past the sequence's N H rows hold the next sequence's rows
// (finite; their outputs are not stored), past the tensor's end zeros.
//
// Shared memory is the v6 kernel's: the rope columns of Q (box 8 of the Q tile) move into
// registers once (RS wgmma for S's last four k-steps), and that box holds P_B (sP1) from then on.
// Rows of the last tile past the KV range end are zeroed by the tile's S warpgroup once the whole
// tile landed (as in verify_attention_tma.cu), before any product reads it. With -DATT_TRACE
// (cuda/attention_trace.cuh) thread 0 of each warpgroup records its handoffs in the first blocks
// (scripts/trace_attention.py); without it the kernel is unchanged.
#include "attention_common.cuh"
#include "attention_pingpong.cuh"
#include "attention_tile.cuh"
#include "attention_trace.cuh"
#include "attention_wgmma.cuh"
#include "pdl.cuh"

#define PAIR_THREADS 256
#define PAIR_NB_ALL 1                   // named barrier: all 256 threads (Q landed; rope read; epilogue)
#define PAIR_BOX_BYTES (FUSED_BN * 128)  // one 64-row x 64-column box
#define PAIR_BOXES (ATT_D_QK / 64)       // 9 boxes a tile: 8 of V / K, the rope box last

// Shared memory: Q (box 8 becomes sP1), two KV stages, sP0, fp32 sM, sScale0, sScale1 [BM],
// sRed [2][BM], then 25 mbarriers: full[2][9], SCALE0, SCALE1, P0, P1, zero[2], QFULL.
#define PAIR_BARRIERS 25
#define PAIR_SMEM_BYTES (FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P + 5 * FUSED_BM * 4 + PAIR_BARRIERS * 8 + 1024)
#define PAIR_SCALE0 18
#define PAIR_SCALE1 19
#define PAIR_P0 20
#define PAIR_P1 21
#define PAIR_ZERO 22
#define PAIR_QFULL 24

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wg_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

__device__ __forceinline__ att_u32 pair_full(att_u32 sBar, int st, int b) { return sBar + 8 * (st * PAIR_BOXES + b); }

// Issue boxes [b0, b1) of split tile i into its stage (one thread).
__device__ __forceinline__ void pair_load(const AttTensorMap* map, att_u32 sKV, att_u32 sBar, int row0, int i, int b0,
                                          int b1) {
  const int st = i & 1;
  for (int b = b0; b < b1; ++b) {
    const att_u32 full = pair_full(sBar, st, b);
    mb_arrive_expect_tx(full, PAIR_BOX_BYTES);
    tma_load_2d(sKV + st * FUSED_SMEM_KV + b * PAIR_BOX_BYTES, map, full, 64 * b, row0 + i * FUSED_BN);
  }
}

// The four k-steps of S over box b of the tile whose descriptor is dK (Q: dQ), once the box landed; the rope box
// (8) takes Q from registers. FIRST: the chain's first k-step overwrites s (no register is written
// outside wgmma while another warpgroup-level product is in flight: ptxas would serialise them).
// The trace records when the tile's first box (FIRST) and its last (LAST) were seen landed.
template <int BOX, bool FIRST, bool LAST>
__device__ __forceinline__ void pair_s_box(float (&s)[8][4], const att_u32 (&qr)[4][4], att_u64 dQ, att_u64 dK,
                                           att_u32 full, int par, AttTrace& tr, int i) {
  static_assert(!(FIRST && BOX == PAIR_BOXES - 1), "S starts on a box of Q in shared memory");
  mb_wait(full, par);
  if (FIRST) att_trace_rec(tr, ATT_EV_FULL_WAIT, i);
  if (LAST) att_trace_rec(tr, ATT_EV_LANDED, i);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const att_u32 off = BOX * PAIR_BOX_BYTES + 32 * kk;
    if (BOX == PAIR_BOXES - 1)
      wg_mma64_rs(&s[0][0], qr[kk], wg_desc_add(dK, off));
    else
      wg_mma<64, 0>(&s[0][0], wg_desc_add(dQ, off), wg_desc_add(dK, off), FIRST && kk == 0 ? 0 : 1);
  }
}

// Boxes B0 .. B0 + NB - 1 (mod 9) of S for split tile i, as one committed wgmma group; FIRST: the
// chain starts here, LAST: it ends here (S issued: a trace record).
template <int B0, int NB, bool FIRST, bool LAST>
__device__ __forceinline__ void pair_s_part(float (&s)[8][4], const att_u32 (&qr)[4][4], att_u32 sQ, att_u32 sKV,
                                            att_u32 sBar, int i, AttTrace& tr) {
  const int st = i & 1, par = (i >> 1) & 1;
  const att_u64 dQ = wg_desc(sQ, 16, 1024), dK = wg_desc(sKV + st * FUSED_SMEM_KV, 16, 1024);
  wg_fence();
#define PAIR_BOX(n) \
  if (NB > n)                                                                                            \
    pair_s_box<(B0 + n) % PAIR_BOXES, FIRST && n == 0, LAST && n == NB - 1>(                            \
        s, qr, dQ, dK, pair_full(sBar, st, (B0 + n) % PAIR_BOXES), par, tr, i);
  PAIR_BOX(0) PAIR_BOX(1) PAIR_BOX(2) PAIR_BOX(3) PAIR_BOX(4) PAIR_BOX(5) PAIR_BOX(6) PAIR_BOX(7) PAIR_BOX(8)
#undef PAIR_BOX
  wg_commit();
  if (LAST) att_trace_rec(tr, ATT_EV_S_ISSUED, i);
}

// Before the first k-step of S on split tile i: if the tile is the range's cut-short last one, wait
// for all its boxes and zero its rows past the range end (warpgroup wg, its zero barrier: once per
// block).
__device__ __forceinline__ void pair_s_begin(att_u32 sKV, att_u32 sBar, const FusedBlock& k, int i, int wg,
                                             int wtid) {
  const int st = i & 1, valid = k.hi - (k.lo + (k.kt0 + i) * FUSED_BN);
  if (valid < FUSED_BN) {
    for (int b = 0; b < PAIR_BOXES; ++b) mb_wait(pair_full(sBar, st, b), (i >> 1) & 1);
    pp_zero_tail_rows(sKV + st * FUSED_SMEM_KV, valid, wtid, sBar + 8 * (PAIR_ZERO + wg));
  }
}

// P (the softmax of s, rows r_lo / r_hi scaled by f_lo / f_hi) as the bf16 A fragments of the four
// k-steps of P V: the S accumulator layout is the A fragment layout.
__device__ __forceinline__ void pair_pack_p(att_u32 (&pa)[4][4], const float (&s)[8][4], float f_lo, float f_hi) {
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    pa[t][0] = att_pack_bf16x2(s[2 * t][0] * f_lo, s[2 * t][1] * f_lo);
    pa[t][1] = att_pack_bf16x2(s[2 * t][2] * f_hi, s[2 * t][3] * f_hi);
    pa[t][2] = att_pack_bf16x2(s[2 * t + 1][0] * f_lo, s[2 * t + 1][1] * f_lo);
    pa[t][3] = att_pack_bf16x2(s[2 * t + 1][2] * f_hi, s[2 * t + 1][3] * f_hi);
  }
}

// Rescale O by al_lo / al_hi, then issue O += P V over value half h of the tile in stage sK with P
// from registers, as one wgmma group, not waited for.
__device__ __forceinline__ void pair_issue_pv_rs(float (&o)[128], float al_lo, float al_hi, const att_u32 (&pa)[4][4],
                                                 att_u32 sK, int h) {
  fused_rescale_o(o, al_lo, al_hi);
  wg_pin<128>(o);
  wg_fence();
  const att_u64 dV = wg_desc(sK + 4 * h * FUSED_BN * 128, FUSED_BN * 128, 1024);
#pragma unroll
  for (int t = 0; t < FUSED_BN / 16; ++t) wg_m64n256k16_rs_tb(o, pa[t], wg_desc_add(dV, 16 * t * 128));
  wg_commit();
}

// This thread's Q rope fragments (box 8 of the Q tile, rows 16 w4 ..: k-step t in qr[t]).
__device__ __forceinline__ void pair_load_rope(att_u32 (&qr)[4][4], att_u32 sQ, int w4, int lane) {
  const int r = 16 * w4 + (lane & 15);
#pragma unroll
  for (int t = 0; t < 4; ++t)
    att_ldmatrix_x4(sQ + fused_off(r, 8 * (PAIR_BOXES - 1) + 2 * t + (lane >> 4), FUSED_BM), qr[t][0], qr[t][1],
                    qr[t][2], qr[t][3]);
}

// O, normalised, through shared memory (the 64 KB of KV stage 0, free once every product is done)
// and the copy engine: each thread writes its bf16 pairs into eight 64 x 64 boxes laid out as
// `omap`'s swizzle wants (conflict-free: a warp's 32 lanes hit 32 banks), the block synchronises,
// and thread 0 stores the boxes to matrix z, rows g0.. (rows past the sequence's N H are outside
// the map and not written) and waits until they have been read. The block's end is then bound by
// the 64 KB leaving the SM, as it was with a 16-byte store per 8 values from every thread; what
// the bulk stores save is those stores' issue (docs/perf_log.md, session 29).
__device__ __forceinline__ void pair_store_o(const float (&o)[128], const AttTensorMap* omap, att_u32 sStage,
                                             const FusedBlock& k, int z, int r_lo, int wg, int tig, const float* sSum,
                                             int tid) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r_lo + 8 * half;
    const float inv = fused_row_inv_sum(sSum, r);
#pragma unroll
    for (int j = 0; j < 32; ++j)  // columns 256 wg + 8 j + 2 tig, + 1: 16-byte chunk 32 wg + j, bytes 4 tig
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sStage + fused_off(r, 32 * wg + j, FUSED_BM) + 4 * tig),
                   "r"(att_pack_bf16x2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv))
                   : "memory");
  }
  att_fence_proxy_async();
  nb_sync(PAIR_NB_ALL, PAIR_THREADS);  // every box written
  if (tid == 0) {
    for (int bx = 0; bx < ATT_D_V / 64; ++bx) tma_store_3d(omap, sStage + bx * PAIR_BOX_BYTES, 64 * bx, k.g0, z);
    tma_store_commit_wait_read();
  }
}

__device__ __forceinline__ void pair_body(const AttTensorMap* map, const AttTensorMap* qmap, const AttTensorMap* omap,
                                          const AttTensorMap* pmap,
                                          const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                                          att_bf16* __restrict__ out, float* __restrict__ lse,
                                          att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B, int S,
                                          int N, int H, int W, int splits, int slot0, int mode, int head,
                                          int tail_splits, float scale_log2) {
  static_assert(FUSED_BM == 64 && FUSED_BN == 64 && ATT_D_V == 2 * 256 && ATT_D_QK == 576,
                "verify_fused_pair: 64 x 64 tiles, 256 value columns a warpgroup, 9 boxes a tile");
  static_assert(PAIR_SMEM_BYTES <= 232448, "shared memory");
  static_assert(FUSED_SMEM_KV == PAIR_BOXES * PAIR_BOX_BYTES && FUSED_SMEM_P == PAIR_BOX_BYTES, "box sizes");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = fused_smem_base(smem_raw);
  const att_u32 sQ = att_smem_addr(smem), sKV = sQ + FUSED_SMEM_Q, sP0 = sKV + 2 * FUSED_SMEM_KV;
  const att_u32 sP1 = sQ + (PAIR_BOXES - 1) * PAIR_BOX_BYTES;
  float* sM = reinterpret_cast<float*>(smem + FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P);
  float *sScale0 = sM + FUSED_BM, *sScale1 = sScale0 + FUSED_BM, *sRed = sScale1 + FUSED_BM;
  const att_u32 sBar = att_smem_addr(sRed + 2 * FUSED_BM);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wtid = tid & 127, gid = lane >> 2, tig = lane & 3;
  const FusedBlock k = head > 0 ? fused_block_ht(prefix_lens, S, N, H, B, splits, head, tail_splits, mode)
                                 : fused_block(prefix_lens, S, N, H, splits, mode);
  const bool part = o_part != nullptr && !k.direct;
  const int n = k.kt1 - k.kt0;  // tiles of this split
  const int row0 = k.b * S + k.lo + k.kt0 * FUSED_BN;
  AttTrace tr = att_trace_open(wg, wtid == 0);
  att_trace_stamp(tr, ATT_EV_ENTRY);

  if (tid == 0) {
    for (int i = 0; i < PAIR_BARRIERS; ++i) mb_init(sBar + 8 * i, i < 2 * PAIR_BOXES || i == PAIR_QFULL ? 1 : 128);
    mb_init_fence();
    tma_prefetch_map(map);
    tma_prefetch_map(qmap);
  }
  pdl_launch_dependents();  // a split's combine may launch once every block runs (it waits for the end)
  if (tid < FUSED_BM) sM[tid] = ATT_NEG_INF;
  __syncthreads();  // barriers initialised, sM set
  if (tid == 0 && n > 0) {  // the Q tile's boxes first (S needs them all), then KV tiles 0 and 1
    mb_arrive_expect_tx(sBar + 8 * PAIR_QFULL, FUSED_SMEM_Q);
    for (int b = 0; b < PAIR_BOXES; ++b)
      tma_load_2d(sQ + b * PAIR_BOX_BYTES, qmap, sBar + 8 * PAIR_QFULL, 64 * b, k.b * k.NH + k.g0);
    pair_load(map, sKV, sBar, row0, 0, 0, PAIR_BOXES);
    if (n > 1) pair_load(map, sKV, sBar, row0, 1, 0, PAIR_BOXES);
  }

  const int r_lo = 16 * (warp & 3) + gid, r_hi = r_lo + 8;
  const FusedRows vr = fused_rows(vis, k, N, H, W, r_lo);
  float o[128];  // O rows r_lo (o[4 j], o[4 j + 1]) / r_hi (o[4 j + 2], o[4 j + 3]), columns 256 wg + 8 j + 2 tig
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  att_u32 qr[4][4];
  if (n > 0) {
    mb_wait(sBar + 8 * PAIR_QFULL, 0);
    pair_load_rope(qr, sQ, warp & 3, lane);
  }
  nb_sync(PAIR_NB_ALL, PAIR_THREADS);  // every rope fragment is read before box 8 holds P_B
  att_trace_stamp(tr, ATT_EV_START);

  float l_lo = 0.f, l_hi = 0.f;
  float s[8][4];  // S of the warpgroup's tile (m64n64 accumulators: n8 tile nt, rows r_lo / r_hi)
  att_u32 pa[4][4];
  const att_u32 sK0 = sKV, sK1 = sKV + FUSED_SMEM_KV;
  if (wg == 0) {
    if (n > 0) {
      pair_s_begin(sKV, sBar, k, 0, 0, wtid);
      pair_s_part<0, PAIR_BOXES, true, true>(s, qr, sQ, sKV, sBar, 0, tr);
    }
    wg_wait_all();
    wg_pin<32>(&s[0][0]);
    att_trace_rec(tr, ATT_EV_S_DONE, 0);
    for (int a = 0; a < n; a += 2) {
      const int par = (a >> 1) & 1;
      const bool has_b = a + 1 < n, next_a = a + 2 < n, next_b = a + 3 < n;
      float mx_lo, mx_hi;
      fused_scale_mask_max(s, k, k.lo + (k.kt0 + a) * FUSED_BN, 0, tig, vr, W, scale_log2, mx_lo, mx_hi);
      att_trace_rec(tr, ATT_EV_MASKED, a);
      float m_lo = sM[r_lo], m_hi = sM[r_hi], mu_lo, mu_hi;
      const float aa_lo = fused_max_step(mx_lo, m_lo, mu_lo), aa_hi = fused_max_step(mx_hi, m_hi, mu_hi);
      pp_publish_stats(sM, sScale0, m_lo, m_hi, aa_lo, aa_hi, r_lo, r_hi, tig);
      mb_arrive(sBar + 8 * PAIR_SCALE0);  // m_A before the exponentials: wg1's softmax of B starts on it
      att_trace_rec(tr, ATT_EV_PUB, a);
      fused_exp_row<0>(s, mu_lo, aa_lo, l_lo);
      fused_exp_row<2>(s, mu_hi, aa_hi, l_hi);
      pair_pack_p(pa, s, 1.f, 1.f);
      pair_issue_pv_rs(o, aa_lo, aa_hi, pa, sK0, 0);
      att_trace_rec(tr, ATT_EV_PV_ISSUED, a);
      wg_wait_all();
      wg_pin<128>(o);
      att_trace_rec(tr, ATT_EV_PV_DONE, a);
      if (next_a && wtid == 0) {
          pair_load(map, sKV, sBar, row0, a + 2, 0, 4);
          att_trace_rec(tr, ATT_EV_TMA_ISSUED, a + 2);
        }
      if (has_b) {
        mb_wait(sBar + 8 * PAIR_SCALE1, par);
        att_trace_rec(tr, ATT_EV_PUB_WAIT, a + 1);
        const float ab_lo = sScale1[r_lo], ab_hi = sScale1[r_hi];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          s[nt][0] *= ab_lo;
          s[nt][1] *= ab_lo;
          s[nt][2] *= ab_hi;
          s[nt][3] *= ab_hi;
        }
        fused_store_p(s, sP0, r_lo, r_hi, 0, tig);  // P_A against m_B, for wg1
        att_fence_proxy_async();
        mb_arrive(sBar + 8 * PAIR_P0);
        l_lo *= ab_lo;
        l_hi *= ab_hi;
        mb_wait(sBar + 8 * PAIR_P1, par);
        att_trace_rec(tr, ATT_EV_FREE_WAIT, a + 1);
        for (int b = 0; b < 4; ++b) mb_wait(pair_full(sBar, 1, b), par);
        att_trace_rec(tr, ATT_EV_EMPTY, a + 1);
        fused_rescale_o(o, ab_lo, ab_hi);
        wg_pin<128>(o);
        att_trace_rec(tr, ATT_EV_EMPTY_WAIT, a + 1);
        pp_pv_steps(o, wg_desc(sP1, 16, 1024), sK1, 0);
        att_trace_rec(tr, ATT_EV_PV_ISSUED, a + 1);
        if (next_a) {  // S of the next A on the boxes this warpgroup loaded, then (P_B V_B done) the rest
          pair_s_begin(sKV, sBar, k, a + 2, 0, wtid);
          pair_s_part<0, 4, true, false>(s, qr, sQ, sKV, sBar, a + 2, tr);
          wg_wait_one();
          att_trace_rec(tr, ATT_EV_PV_DONE, a + 1);
          if (next_b && wtid == 0) {
          pair_load(map, sKV, sBar, row0, a + 3, 0, 4);
          att_trace_rec(tr, ATT_EV_TMA_ISSUED, a + 3);
        }
          pair_s_part<4, PAIR_BOXES - 4, false, true>(s, qr, sQ, sKV, sBar, a + 2, tr);
        }
      } else {
        fused_store_p(s, sP0, r_lo, r_hi, 0, tig);  // the last tile: P_A against m_A
        att_fence_proxy_async();
        mb_arrive(sBar + 8 * PAIR_P0);
      }
      wg_wait_all();
      wg_pin<128>(o);
      wg_pin<32>(&s[0][0]);
      att_trace_rec(tr, ATT_EV_S_DONE, a + 2);
    }
  } else {
    if (n > 1) {
      pair_s_begin(sKV, sBar, k, 1, 1, wtid);
      pair_s_part<4, PAIR_BOXES, true, true>(s, qr, sQ, sKV, sBar, 1, tr);
    }
    wg_wait_all();
    wg_pin<32>(&s[0][0]);
    att_trace_rec(tr, ATT_EV_S_DONE, 1);
    for (int a = 0; a < n; a += 2) {
      const int par = (a >> 1) & 1;
      const bool has_b = a + 1 < n, next_a = a + 2 < n, next_b = a + 3 < n;
      mb_wait(sBar + 8 * PAIR_SCALE0, par);
      att_trace_rec(tr, ATT_EV_PUB_WAIT, a);
      const float aa_lo = sScale0[r_lo], aa_hi = sScale0[r_hi];
      float ab_lo = 1.f, ab_hi = 1.f, mu_lo, mu_hi;
      l_lo *= aa_lo;
      l_hi *= aa_hi;
      if (has_b) {
        float mx_lo, mx_hi;
        fused_scale_mask_max(s, k, k.lo + (k.kt0 + a + 1) * FUSED_BN, 0, tig, vr, W, scale_log2, mx_lo,
                             mx_hi);
        att_trace_rec(tr, ATT_EV_MASKED, a + 1);
        float m_lo = sM[r_lo], m_hi = sM[r_hi];
        ab_lo = fused_max_step(mx_lo, m_lo, mu_lo);
        ab_hi = fused_max_step(mx_hi, m_hi, mu_hi);
        pp_publish_stats(sM, sScale1, m_lo, m_hi, ab_lo, ab_hi, r_lo, r_hi, tig);
        mb_arrive(sBar + 8 * PAIR_SCALE1);  // alpha_B before the exponentials: wg0 scales and stores P_A on it
        att_trace_rec(tr, ATT_EV_PUB, a + 1);
      }
      fused_rescale_o(o, aa_lo, aa_hi);
      wg_pin<128>(o);
      if (has_b) {
        fused_exp_row<0>(s, mu_lo, ab_lo, l_lo);
        fused_exp_row<2>(s, mu_hi, ab_hi, l_hi);
        fused_store_p(s, sP1, r_lo, r_hi, 0, tig);  // P_B, for wg0
        att_fence_proxy_async();
        mb_arrive(sBar + 8 * PAIR_P1);
        pair_pack_p(pa, s, 1.f, 1.f);
        pair_issue_pv_rs(o, ab_lo, ab_hi, pa, sK1, 1);
        att_trace_rec(tr, ATT_EV_PV_ISSUED, a + 1);
      }
      mb_wait(sBar + 8 * PAIR_P0, par);
      att_trace_rec(tr, ATT_EV_FREE_WAIT, a);
      for (int b = 4; b < 8; ++b) mb_wait(pair_full(sBar, 0, b), par);  // V_A's boxes (landed before S_A)
      pp_pv_steps(o, wg_desc(sP0, 16, 1024), sK0, 1);  // (with B: while B's P V runs)
      att_trace_rec(tr, ATT_EV_PV_ISSUED, a);
      if (has_b) {
        wg_wait_one();
        att_trace_rec(tr, ATT_EV_PV_DONE, a + 1);
        if (next_b && wtid == 0) {
          pair_load(map, sKV, sBar, row0, a + 3, 4, PAIR_BOXES);
          att_trace_rec(tr, ATT_EV_TMA_ISSUED, a + 3);
        }
      }
      wg_wait_all();
      wg_pin<128>(o);
      att_trace_rec(tr, ATT_EV_PV_DONE, a);
      if (next_a && wtid == 0) {
          pair_load(map, sKV, sBar, row0, a + 2, 4, PAIR_BOXES);
          att_trace_rec(tr, ATT_EV_TMA_ISSUED, a + 2);
        }
      if (next_b) {
        pair_s_begin(sKV, sBar, k, a + 3, 1, wtid);
        pair_s_part<4, PAIR_BOXES, true, true>(s, qr, sQ, sKV, sBar, a + 3, tr);
      }
      wg_wait_all();
      wg_pin<32>(&s[0][0]);
      att_trace_rec(tr, ATT_EV_S_DONE, a + 3);
    }
  }
  pp_row_sums(l_lo, l_hi, sRed, wg, r_lo, r_hi, tig);
  nb_sync(PAIR_NB_ALL, PAIR_THREADS);  // both partial sums and the final sM; every product done
  att_trace_rec(tr, ATT_EV_EPI_SYNC, -1);
  if (!part)
    pair_store_o(o, omap, sKV, k, k.b, r_lo, wg, tig, sRed, tid);
  else
    pair_store_o(o, pmap, sKV, k, (slot0 + k.split) * B + k.b, r_lo, wg, tig, sRed, tid);
  att_trace_rec(tr, ATT_EV_O_STORED, -1);
  fused_store_lse(lse, lse_part, part, k, B, slot0, sRed, sM, tid);
  att_trace_rec(tr, ATT_EV_END, n);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// kv and q are read only through `map` and `qmap` (the [B N H, 576] rows of q, 64 x 64 boxes like
// the kv map's), and O written only through `omap` (out as B matrices of [N H, 512]) or, with split
// partials, `pmap` (o_part as slots x B such matrices); the pointers stay for the common launch
// protocol. head > 0: a head/tail launch on a 1-D grid (fused_block_ht), its whole row tiles
// written to out, its split ones to o_part.
extern "C" __global__ void __launch_bounds__(PAIR_THREADS, 1)
    verify_fused_pair(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                      const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                      att_bf16* __restrict__ out, float* __restrict__ lse, att_bf16* __restrict__ o_part,
                      float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, int slot0,
                      int mode, int head, int tail_splits, float scale_log2, const __grid_constant__ AttTensorMap map,
                      const __grid_constant__ AttTensorMap qmap, const __grid_constant__ AttTensorMap omap,
                      const __grid_constant__ AttTensorMap pmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pair_body(&map, &qmap, &omap, &pmap, prefix_lens, vis, out, lse, o_part, lse_part, B, S, N, H, W, splits, slot0, mode,
            head, tail_splits, scale_log2);
#endif
}
