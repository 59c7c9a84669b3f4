// verify_fused_rn72 on wgmma (sm_90a): the rows_n layout with every row of a block on one wgmma
// N of 72, for the tensor-parallel shard shapes (H = 8, N = 9 is 72 rows a sequence, which 64-row
// tiles compute as 128). Same function, arguments, split/partial protocol and combine as
// verify_fused (verify_attention.cu), plus the kv tensor map of the TMA kernels.
//
// Why N = 72 in one instruction: an m64nNk16 costs about 40 cycles of issue whatever N is up to
// 32, and runs at the dense rate from N = 64 (scripts/wgmma_probe.py, modes 6 and 7): v4's rows_n
// kernel split a block's rows over both warpgroups (N <= 32 each) and paid per instruction.
//   S^T[64 tokens x 72 rows] = K Q^T     (A = K tile, K-major; B = Q, K-major)
//   O^T[512 x 72 rows]      += V^T P^T   (A = V^T: the tile read MN-major; B = P, K-major)
// Roles: warpgroup 0 computes S^T of every tile, the softmax and P, and O^T's value
// blocks 0-1; warpgroup 1 computes value blocks 2-7 once P and the tile's rescale (alpha) are
// published. Warpgroup 0's S^T of tile t + 1 runs while warpgroup 1's O^T of tile t does. A row's
// max over a tile's 64 tokens spans 8 lanes of 4 warps (shuffles, then shared memory): taken only
// on tiles where some score exceeds its row's shift by more than RN72_SLACK. The
// 2 / 6 split evens the registers (S^T's 36 accumulators and the softmax state are warpgroup 0's):
// with 4 / 4 ptxas serialised every wgmma, with 3 / 5 it spilled.
//
// Shared memory (no base slack: the dynamic window starts 1024-aligned, checked):
//   Q [9 boxes][72 rows][128 B] | V stages [2][8 boxes][64 tokens][128 B] | rope box [64][128 B]
//   | P [72 rows][128 B] (also the warps' max partials before P is written) | alpha [2][72] fp32
//   | mbarriers | two flags (the tile rescaled O^T).
// Loads (copy engine, 64 x 64 boxes of the kv map): a tile's value boxes in two groups, each on
// its own mbarrier: boxes 2-7 (read by S^T and warpgroup 1's O^T) refilled by warpgroup 1 once its
// O^T is done, boxes 0-1 by warpgroup 0 once its own O^T is; the rope box (S^T only) once S^T
// read it. S^T waits for all three before its first k-step (a wait between wgmma issues made ptxas
// serialise them), and walks the rope box first (its slot refills as soon as those k-steps are
// done), then boxes 2-7, then 0-1.
#include "attention_common.cuh"
#include "attention_tile.cuh"
#include "attention_trace.cuh"
#include "attention_wgmma.cuh"

#define RN72_ROWS 72
#define RN72_BOX (FUSED_BN * 128)                 // one 64-token x 64-column box (8 KB)
#define RN72_QBOX (RN72_ROWS * 128)               // one 72-row x 64-column box of Q (9 KB)
#define RN72_SMEM_Q (9 * RN72_QBOX)
#define RN72_SMEM_V (8 * RN72_BOX)                // a stage: the 8 value (latent) boxes
#define RN72_OFF_V RN72_SMEM_Q
#define RN72_OFF_R (RN72_OFF_V + 2 * RN72_SMEM_V)
#define RN72_OFF_P (RN72_OFF_R + RN72_BOX)
#define RN72_OFF_A (RN72_OFF_P + RN72_QBOX)
#define RN72_OFF_BAR (RN72_OFF_A + 2 * RN72_ROWS * 4)
// mbarriers: FULL_LO[2], FULL_HI[2], FULL_R, PFULL, PEMPTY, INV
#define RN72_FULL_LO 0
#define RN72_FULL_HI 2
#define RN72_FULL_R 4
#define RN72_PFULL 5
#define RN72_PEMPTY 6
#define RN72_INV 7
#define RN72_BARRIERS 8
#define RN72_OFF_FLAG (RN72_OFF_BAR + RN72_BARRIERS * 8)  // int [2]: the tile rescales O^T
#define RN72_SMEM_BYTES (RN72_OFF_FLAG + 2 * 4)
#define RN72_SLACK 8.f  // log2 units a score may exceed its row's shift before the shift moves
static_assert(RN72_SMEM_BYTES <= 227 * 1024, "one block per SM");
static_assert(4 * RN72_ROWS * 4 <= RN72_QBOX, "the max partials fit in the P tile");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void rn72_wait_group1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// OR of `v` over the `count` threads of named barrier `id` (a barrier as well).
__device__ __forceinline__ bool nb_any(int id, int count, bool v) {
  att_u32 r;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(r) : "r"((att_u32)v), "r"(id), "r"(count) : "memory");
  return r != 0;
}

#define RN72_NB0 2  // value blocks (64 columns) of warpgroup 0's O^T; warpgroup 1 has the other 6

// Issue value boxes [b0, b1) of the tile at kv map row row0 into stage st (one thread).
__device__ __forceinline__ void rn72_load_boxes(const AttTensorMap* map, att_u32 sV, att_u32 bar, int st, int b0,
                                                int b1, int row0) {
  mb_arrive_expect_tx(bar, (b1 - b0) * RN72_BOX);
  for (int b = b0; b < b1; ++b) tma_load_2d(sV + st * RN72_SMEM_V + b * RN72_BOX, map, bar, 64 * b, row0);
}

// Issue every value box of the tile at kv map row row0 into stage st, in the two groups (one thread).
__device__ __forceinline__ void rn72_load_tile(const AttTensorMap* map, att_u32 sV, att_u32 bar, int st, int row0) {
  rn72_load_boxes(map, sV, bar + 8 * (RN72_FULL_HI + st), st, RN72_NB0, 8, row0);
  rn72_load_boxes(map, sV, bar + 8 * (RN72_FULL_LO + st), st, 0, RN72_NB0, row0);
}

__device__ __forceinline__ void rn72_load_rope(const AttTensorMap* map, att_u32 sR, att_u32 bar, int row0) {
  mb_arrive_expect_tx(bar, RN72_BOX);
  tma_load_2d(sR, map, bar, 512, row0);
}

// This thread's accumulator x[4 j + 2 e + c] (S^T, and each O^T block alike) sits at M index
// 16 wq + gid + 8 e (a token, or a value column within the block) and N index 8 j + 2 tig + c (a
// block row); ci = 2 j + c numbers its 18 columns.
__device__ __forceinline__ int rn72_col(int ci, int tig) { return 8 * (ci >> 1) + 2 * tig + (ci & 1); }

// O^T value blocks [i0, i0 + NB) of a tile: A = the stage's box i read MN-major, B = P.
template <int NB>
__device__ __forceinline__ void rn72_pv(float* o, att_u32 sVst, att_u32 sP, int i0) {
  att_u64 dV = wg_desc(sVst + i0 * RN72_BOX, RN72_BOX, 1024), dP = wg_desc(sP, 16, 1024);
  asm volatile("" : "+l"(dV), "+l"(dP));
  wg_fence();
#pragma unroll
  for (int i = 0; i < NB; ++i)
#pragma unroll
    for (int t = 0; t < FUSED_BN / 16; ++t)
      wg_mma<RN72_ROWS, 1>(o + i * 36, wg_desc_add(dV, i * RN72_BOX + t * 16 * 128), wg_desc_add(dP, 32 * t));
  wg_commit();
}

// The end of both warpgroups: out (or the split's partials) of the block's real rows from this
// warpgroup's O^T blocks [vb0, vb0 + NB), each row scaled by 1 / its sum (inv, in shared memory).
// O^T's accumulator has P's layout (value dims for tokens), so rows_n_store_p writes each 64-value
// block into sO as 72 rows of 128 bytes (swizzled); then the warpgroup copies whole 16-byte chunks,
// consecutive threads along a row. Scalar bf16 stores of the fragments took 216 a thread in
// warpgroup 1, 3.3 us of a block's end (docs/perf_log.md, session 38). sO: the value stages, free
// once both warpgroups' last O^T is done (no load is in flight past the last tile).
template <int NB>
__device__ __forceinline__ void rn72_store(float* o, const float* inv_s, const FusedBlock& k, int rows, int vb0,
                                           att_u32 sO, int bar_id, int wtid, int wq, int gid, int tig,
                                           att_bf16* __restrict__ out, att_bf16* __restrict__ o_part, int B,
                                           int slot0) {
#pragma unroll
  for (int ci = 0; ci < 18; ++ci) {
    const float inv = inv_s[rn72_col(ci, tig)];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      o[b * 36 + 4 * (ci >> 1) + (ci & 1)] *= inv;
      o[b * 36 + 4 * (ci >> 1) + 2 + (ci & 1)] *= inv;
    }
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) rows_n_store_p<9>(o + b * 36, sO + b * RN72_QBOX, 0, RN72_ROWS, wq, 4 * gid + tig);
  nb_sync(bar_id, 128);
  const size_t g0 = (size_t)k.b * k.NH + k.g0;  // the block's first row
  att_bf16* dst = o_part != nullptr ? o_part + ((size_t)(slot0 + k.split) * B * k.NH + g0) * ATT_D_V
                                    : out + g0 * ATT_D_V;
  for (int i = wtid; i < rows * NB * 8; i += 128) {
    const int r = i / (NB * 8), b = (i >> 3) % NB, c = i & 7;
    att_u32 x, y, z, w;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                 : "r"(sO + b * RN72_QBOX + fused_off(r, c, RN72_ROWS)));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + (size_t)r * ATT_D_V + 64 * (vb0 + b) + 8 * c),
                 "r"(x), "r"(y), "r"(z), "r"(w)
                 : "memory");
  }
}

// Warpgroup 0: S^T of every tile, the softmax, P, O^T value blocks 0 .. RN72_NB0 - 1; at the end
// the row sums, lse and 1 / sum for both warpgroups.
__device__ __forceinline__ void rn72_wg0(const AttTensorMap* map, att_u32 sQ, att_u32 sV, att_u32 sR, att_u32 sP,
                                         float* red, float* sAlpha, int* sRescale, att_u32 bar, const FusedBlock& k, int rows,
                                         int row_base, int n_tiles, const long long* __restrict__ vis, int N, int H,
                                         int W, int tid, int wq, int gid, int tig, float scale_log2,
                                         att_bf16* __restrict__ out, float* __restrict__ lse,
                                         att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B,
                                         int slot0, AttTrace& tr) {
  constexpr int NO = RN72_NB0 * 36;
  float o[NO], m[18], l[18];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 18; ++i) {
    m[i] = ATT_NEG_INF;
    l[i] = 0.f;
  }
  for (int i = 0; i < n_tiles; ++i) {
    const int st = i & 1, kt = k.kt0 + i, T = k.lo + kt * FUSED_BN;
    const att_u32 sVst = sV + st * RN72_SMEM_V;
    float s[36];
    mb_wait(bar + 8 * (RN72_FULL_HI + st), (i >> 1) & 1);
    mb_wait(bar + 8 * (RN72_FULL_LO + st), (i >> 1) & 1);
    att_trace_rec(tr, ATT_EV_FULL_WAIT, i);
    mb_wait(bar + 8 * RN72_FULL_R, i & 1);
    att_trace_rec(tr, ATT_EV_LANDED, i);
    // Descriptors kept opaque per tile, so that each k-step's is one add next to its wgmma instead
    // of all 72 hoisted out of the tile loop into registers.
    att_u64 dQ = wg_desc(sQ, 16, 1024), dK = wg_desc(sVst, 16, 1024), dR = wg_desc(sR, 16, 1024);
    asm volatile("" : "+l"(dQ), "+l"(dK), "+l"(dR));
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)  // the rope box first: its slot refills once these are done
      wg_mma<RN72_ROWS, 0>(s, wg_desc_add(dR, ks * 32), wg_desc_add(dQ, 8 * RN72_QBOX + ks * 32), ks == 0 ? 0 : 1);
    wg_commit();
#pragma unroll
    for (int ks = 0; ks < 32; ++ks) {  // value boxes RN72_NB0 .. 7, then 0 .. RN72_NB0 - 1
      const int b = (RN72_NB0 + (ks >> 2)) & 7;
      wg_mma<RN72_ROWS, 0>(s, wg_desc_add(dK, b * RN72_BOX + (ks & 3) * 32), wg_desc_add(dQ, b * RN72_QBOX + (ks & 3) * 32));
    }
    wg_commit();
    att_trace_rec(tr, ATT_EV_S_ISSUED, i);
    rn72_wait_group1();  // the rope k-steps are done
    if (tid == 0 && i + 1 < n_tiles) rn72_load_rope(map, sR, bar + 8 * RN72_FULL_R, row_base + (kt + 1) * FUSED_BN);
    wg_wait_all();
    wg_pin<36>(s);
    wg_pin<NO>(o);
    att_trace_rec(tr, ATT_EV_S_DONE, i);

    // The P tile holds the max partials until P is written: warpgroup 1 must be done reading P
    // of tile i - 1 (its O^T waited).
    if (i > 0) mb_wait(bar + 8 * RN72_PEMPTY, (i - 1) & 1);
    att_trace_rec(tr, ATT_EV_FREE_WAIT, i);
    // Scale to the log2 domain and mask (rows_n_scale_mask). The shift of a row's exponentials is
    // its running max m, kept until a tile's score exceeds it by more than RN72_SLACK
    // (FlashAttention-4's conditional rescale): P then stays below 2^RN72_SLACK, and a tile that
    // exceeds nowhere (one OR over the warpgroup) skips the cross-warp max and both warpgroups'
    // rescale of O^T.
    rows_n_scale_mask<9>(s, k, T, 0, wq, gid, tig, vis, N, H, W, scale_log2);
    bool over = false;
#pragma unroll
    for (int ci = 0; ci < 18; ++ci)
      over |= fmaxf(s[4 * (ci >> 1) + (ci & 1)], s[4 * (ci >> 1) + 2 + (ci & 1)]) > m[ci] + RN72_SLACK;
    if (nb_any(1, 128, over)) {
      // The full step: each row's max over the tile (8 lanes, then the 4 warps through the
      // partials), the new shift, and the rescale alpha of the running sums and of O^T.
#pragma unroll
      for (int ci = 0; ci < 18; ++ci) {
        float mx = fmaxf(s[4 * (ci >> 1) + (ci & 1)], s[4 * (ci >> 1) + 2 + (ci & 1)]);
#pragma unroll
        for (int off = 4; off <= 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (gid == 0) red[wq * RN72_ROWS + rn72_col(ci, tig)] = mx;
      }
      nb_sync(1, 128);
#pragma unroll
      for (int ci = 0; ci < 18; ++ci) {
        const int col = rn72_col(ci, tig);
        const float tmx = fmaxf(fmaxf(red[col], red[RN72_ROWS + col]),
                                fmaxf(red[2 * RN72_ROWS + col], red[3 * RN72_ROWS + col]));
        const float mn = fmaxf(m[ci], tmx);
        const float mu = mn == ATT_NEG_INF ? 0.f : mn;  // a column that has seen no key yet
        const float alpha = att_exp2(m[ci] - mu);
        m[ci] = mn;
        l[ci] *= alpha;
        if (wq == 0 && gid == 0) sAlpha[st * RN72_ROWS + col] = alpha;
#pragma unroll
        for (int b = 0; b < RN72_NB0; ++b) {
          o[b * 36 + 4 * (ci >> 1) + (ci & 1)] *= alpha;
          o[b * 36 + 4 * (ci >> 1) + 2 + (ci & 1)] *= alpha;
        }
      }
      if (tid == 0) sRescale[st] = 1;
      nb_sync(1, 128);  // every warp read the partials: P may overwrite them
      att_trace_rec(tr, ATT_EV_RESCALED, i);
    } else if (tid == 0) {
      sRescale[st] = 0;
    }
    att_trace_rec(tr, ATT_EV_MASKED, i);
#pragma unroll
    for (int ci = 0; ci < 18; ++ci) {
      const float mu = m[ci] == ATT_NEG_INF ? 0.f : m[ci];
      float& p0 = s[4 * (ci >> 1) + (ci & 1)];
      float& p1 = s[4 * (ci >> 1) + 2 + (ci & 1)];
      p0 = att_exp2(p0 - mu);
      p1 = att_exp2(p1 - mu);
      l[ci] += p0 + p1;
    }
    rows_n_store_p<9>(s, sP, 0, RN72_ROWS, wq, 4 * gid + tig);  // P as bf16, K-major
    att_fence_proxy_async();
    mb_arrive(bar + 8 * RN72_PFULL);
    att_trace_rec(tr, ATT_EV_PUB, i);
    wg_pin<NO>(o);
    rn72_pv<RN72_NB0>(o, sVst, sP, 0);
    att_trace_rec(tr, ATT_EV_PV_ISSUED, i);
    // Waited here, not behind the next S^T: ptxas serialises every wgmma of a loop that waits
    // with wait_group 1 and then touches the accumulators. The boxes 0 .. NB0 - 1 refill at once.
    wg_wait_all();
    wg_pin<NO>(o);
    att_trace_rec(tr, ATT_EV_PV_DONE, i);
    if (tid == 0 && i + 2 < n_tiles) {
      rn72_load_boxes(map, sV, bar + 8 * (RN72_FULL_LO + st), st, 0, RN72_NB0, row_base + (kt + 2) * FUSED_BN);
      att_trace_rec(tr, ATT_EV_TMA_ISSUED, i + 2);
    }
  }

  // Row sums over the 64 token lanes, lse, and 1 / sum for both warpgroups (alpha's slots).
  // Warpgroup 1's last O^T is done: the P tile is free. (The hand-offs of the end are mbarriers
  // too: with named barriers of both warpgroups, racecheck reported the 1 / sum slots.)
  if (n_tiles > 0) mb_wait(bar + 8 * RN72_PEMPTY, (n_tiles - 1) & 1);
  att_trace_rec(tr, ATT_EV_EPI_SYNC, -1);
  // Each row's sum over the 4 warps' partials, and its shift (the same in every warp): one row a
  // thread of the first 72 (4 threads looping over 18 rows each took 2 us, session 38).
#pragma unroll
  for (int ci = 0; ci < 18; ++ci) {
#pragma unroll
    for (int off = 4; off <= 16; off <<= 1) l[ci] += __shfl_xor_sync(0xffffffffu, l[ci], off);
    if (gid == 0) red[wq * RN72_ROWS + rn72_col(ci, tig)] = l[ci];
    if (gid == 0 && wq == 0) red[4 * RN72_ROWS + rn72_col(ci, tig)] = m[ci];
  }
  nb_sync(1, 128);
  if (tid < RN72_ROWS) {
    const float sum = (red[tid] + red[RN72_ROWS + tid]) + (red[2 * RN72_ROWS + tid] + red[3 * RN72_ROWS + tid]);
    sAlpha[tid] = sum > 0.f ? 1.f / sum : 0.f;
    if (tid < rows) fused_write_lse(lse, lse_part, o_part != nullptr, k, B, slot0, tid, red[4 * RN72_ROWS + tid], sum);
  }
  mb_arrive(bar + 8 * RN72_INV);  // 1 / sum published
  nb_sync(1, 128);
  rn72_store<RN72_NB0>(o, sAlpha, k, rows, 0, sV, 1, tid, wq, gid, tig, out, o_part, B, slot0);
  att_trace_rec(tr, ATT_EV_O_STORED, -1);
}

// Warpgroup 1: O^T value blocks RN72_NB0 .. 7 of every tile once P is published, and the refill
// of those boxes.
__device__ __forceinline__ void rn72_wg1(const AttTensorMap* map, att_u32 sV, att_u32 sP, const float* sAlpha,
                                         const int* sRescale,
                                         att_u32 bar, const FusedBlock& k, int rows, int row_base, int n_tiles,
                                         int tid, int wq, int gid, int tig, att_bf16* __restrict__ out,
                                         att_bf16* __restrict__ o_part, int B, int slot0, AttTrace& tr) {
  constexpr int NB = 8 - RN72_NB0, NO = NB * 36;
  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  for (int i = 0; i < n_tiles; ++i) {
    const int st = i & 1, kt = k.kt0 + i;
    mb_wait(bar + 8 * RN72_PFULL, i & 1);
    att_trace_rec(tr, ATT_EV_PUB_WAIT, i);
    if (sRescale[st])  // the tile moved some row's shift: rescale this warpgroup's O^T
#pragma unroll
    for (int ci = 0; ci < 18; ++ci) {
      const float a = sAlpha[st * RN72_ROWS + rn72_col(ci, tig)];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        o[b * 36 + 4 * (ci >> 1) + (ci & 1)] *= a;
        o[b * 36 + 4 * (ci >> 1) + 2 + (ci & 1)] *= a;
      }
    }
    wg_pin<NO>(o);
    rn72_pv<NB>(o, sV + st * RN72_SMEM_V, sP, RN72_NB0);
    att_trace_rec(tr, ATT_EV_PV_ISSUED, i);
    wg_wait_all();
    wg_pin<NO>(o);
    att_trace_rec(tr, ATT_EV_PV_DONE, i);
    mb_arrive(bar + 8 * RN72_PEMPTY);
    if (tid == 128 && i + 2 < n_tiles) {
      rn72_load_boxes(map, sV, bar + 8 * (RN72_FULL_HI + st), st, RN72_NB0, 8, row_base + (kt + 2) * FUSED_BN);
      att_trace_rec(tr, ATT_EV_TMA_ISSUED, i + 2);
    }
  }
  mb_wait(bar + 8 * RN72_INV, 0);  // 1 / sum published
  att_trace_rec(tr, ATT_EV_EPI_SYNC, -1);
  rn72_store<NB>(o, sAlpha, k, rows, RN72_NB0, sV + RN72_NB0 * RN72_QBOX, 2, tid - 128, wq, gid, tig, out, o_part,
                 B, slot0);
  att_trace_rec(tr, ATT_EV_O_STORED, -1);
}


__device__ __forceinline__ void rn72_body(const AttTensorMap* map, const att_bf16* __restrict__ q,
                                          const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                                          att_bf16* __restrict__ out, float* __restrict__ lse,
                                          att_bf16* __restrict__ o_part, float* __restrict__ lse_part, int B, int S,
                                          int N, int H, int W, int splits, int slot0, int mode, float scale_log2) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const att_u32 base = att_smem_addr(smem);
  if (base & 1023u) __trap();  // the 128-byte swizzle needs 1024-aligned tiles, and there is no slack
  const att_u32 sQ = base, sV = base + RN72_OFF_V, sR = base + RN72_OFF_R, sP = base + RN72_OFF_P;
  float* red = reinterpret_cast<float*>(smem + RN72_OFF_P);     // [5][72] (4 warps, then shifts), while P is free
  float* sAlpha = reinterpret_cast<float*>(smem + RN72_OFF_A);  // [2][72]
  int* sRescale = reinterpret_cast<int*>(smem + RN72_OFF_FLAG);   // [2]
  const att_u32 bar = base + RN72_OFF_BAR;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const int wq = warp & 3, gid = lane >> 2, tig = lane & 3;
  AttTrace tr = att_trace_open(wg, (tid & 127) == 0);  // thread 0 of each warpgroup, with -DATT_TRACE
  att_trace_stamp(tr, ATT_EV_ENTRY);
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode, RN72_ROWS);
  const int rows = min(RN72_ROWS, k.NH - k.g0);
  const int row_base = k.b * S + k.lo;  // kv map row of the range's first token

  if (tid == 0) {
    for (int i = 0; i < RN72_PFULL; ++i) mb_init(bar + 8 * i, 1);  // the loads' barriers: one arrival each
    mb_init(bar + 8 * RN72_PFULL, 128);
    mb_init(bar + 8 * RN72_PEMPTY, 128);
    mb_init(bar + 8 * RN72_INV, 128);
    mb_init_fence();
    tma_prefetch_map(map);
  }
  __syncthreads();
  const int n_tiles = k.kt1 - k.kt0;
  // Q (the block's rows, rows past the sequence's N H zero-filled; K-major, 128-byte swizzle),
  // then KV tile 0 and its rope box; tile 1 below.
  if (n_tiles > 0) {
    const att_bf16* qb = q + ((size_t)k.b * k.NH + k.g0) * ATT_D_QK;
    for (int i = tid; i < RN72_ROWS * QK_CHUNKS; i += FUSED_THREADS) {
      const int r = i / QK_CHUNKS, c = i - r * QK_CHUNKS;
      const bool ok = r < rows;
      att_cp_async16(sQ + fused_off(r, c, RN72_ROWS), ok ? qb + (size_t)r * ATT_D_QK + c * 8 : qb, ok ? 16 : 0);
    }
    att_cp_async_commit();
  }
  if (tid == 0 && n_tiles > 0) {
    rn72_load_tile(map, sV, bar, 0, row_base + k.kt0 * FUSED_BN);
    rn72_load_rope(map, sR, bar + 8 * RN72_FULL_R, row_base + k.kt0 * FUSED_BN);
  }
  if (n_tiles > 0) {
    att_cp_async_wait_all();
    att_fence_proxy_async();
  }
  // Tile 1 only once tile 0 has landed: issued together, the launch's blocks all queued both tiles
  // at once and tile 0 landed only with the whole burst (S^T of tile 0 waits for it anyway).
  if (tid == 0 && n_tiles > 1) {
    mb_wait(bar + 8 * RN72_FULL_HI, 0);
    mb_wait(bar + 8 * RN72_FULL_LO, 0);
    rn72_load_tile(map, sV, bar, 1, row_base + (k.kt0 + 1) * FUSED_BN);
  }
  __syncthreads();
  att_trace_stamp(tr, ATT_EV_START);

  if (wg == 0)
    rn72_wg0(map, sQ, sV, sR, sP, red, sAlpha, sRescale, bar, k, rows, row_base, n_tiles, vis, N, H, W, tid, wq, gid, tig,
             scale_log2, out, lse, o_part, lse_part, B, slot0, tr);
  else
    rn72_wg1(map, sV, sP, sAlpha, sRescale, bar, k, rows, row_base, n_tiles, tid, wq, gid, tig, out, o_part, B, slot0,
             tr);
  att_trace_rec(tr, ATT_EV_END, -1);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// kv is read only through `map` (the kv map of the TMA kernels: [B S, 576] rows, 64 x 64 boxes);
// the pointer stays for the common launch protocol.
extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 1)
    verify_fused_rn72(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
                      const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
                      att_bf16* __restrict__ out, float* __restrict__ lse, att_bf16* __restrict__ o_part,
                      float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, int slot0,
                      int mode, float scale_log2, const __grid_constant__ AttTensorMap map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  rn72_body(&map, q, prefix_lens, vis, out, lse, o_part, lse_part, B, S, N, H, W, splits, slot0, mode, scale_log2);
#endif
}
