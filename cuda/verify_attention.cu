// Tree-verify MLA-absorb attention (kdtree.verify_attention).
//
// q [B, N, H, 576] bf16, kv [B, S, 576] bf16 (value = first 512 of each latent row), the tree
// rows of sequence b at kv[b, P_b .. P_b + N - 1], visibility int64 [B, N, W] (bit j of row i:
// node j is an ancestor of i or i itself). Query row (n, h) attends to kv[b, 0 .. P_b - 1] and to
// the tree rows its visibility row marks. out [B, N, H, 512] bf16, lse [B, N, H] fp32 (natural
// log; -inf with out = 0 for a row that sees no key). Softmax runs in the log2 domain:
// scale_log2 = scale * log2(e).
//
// Kernels:
//   verify_naive    one block per (sequence, query, head); re-reads the latent rows per head
//                   (the original engine's design, the baseline the workbook diagnoses).
//   verify_fused    one block per (tile of 64 (query, head) rows, KV split, sequence): reads
//                   each latent row once per tile, QK^T and PV on mma.sync bf16 tensor cores,
//                   ancestor mask on the tree rows in the same pass. Writes out/lse directly,
//                   or per-split partials (o normalised, bf16; lse fp32 in log2) for verify_combine.
//                   `mode` restricts the KV range (1: prefix only, 2: tree only) for the cascade.
//                   verify_attention_wgmma.cu holds the same kernel on wgmma (sm_90a).
//   verify_combine  lse-merges `slots` partials into out/lse.
#include "attention_common.cuh"
#include "attention_tile.cuh"
#include "pdl.cuh"

// verify_fused's warp layout: for S = Q K^T warp w owns rows 16 * (w / 2) .. +15 and KV
// columns 32 * (w % 2) .. +31; for O += P V it owns all 64 rows and value columns 64 * w .. +63.
static_assert(FUSED_BM == 64 && FUSED_BN == 64 && FUSED_THREADS == 256, "verify_fused: 8 warps, 64 x 64 tiles");
static_assert(ATT_D_V == 8 * 64, "verify_fused: 8 warps x 64 value columns");

// QK fragments of k-step ks: Q rows 16 * mg .. +15 (a) and K rows (tokens) 32 * ng .. +31 as
// four n8 tiles (b[2 nt], b[2 nt + 1] for tile nt).
__device__ __forceinline__ void fused_qk_frags(att_u32 sQ, att_u32 sK, int ks, int mg, int ng, int lane,
                                               att_u32* a, att_u32* b) {
  att_ldmatrix_x4(sQ + fused_off(16 * mg + (lane & 15), 2 * ks + (lane >> 4), FUSED_BM), a[0], a[1], a[2], a[3]);
#pragma unroll
  for (int pp = 0; pp < 2; ++pp) {
    const int tok = 32 * ng + 16 * pp + 8 * (lane >> 4) + (lane & 7);
    att_ldmatrix_x4(sK + fused_off(tok, 2 * ks + ((lane >> 3) & 1), FUSED_BN), b[4 * pp], b[4 * pp + 1],
                    b[4 * pp + 2], b[4 * pp + 3]);
  }
}

// PV A fragments of k-step ks: P rows 16 * mt .. +15, tokens 16 * ks .. +15 (a[4 mt .. 4 mt + 3]).
__device__ __forceinline__ void fused_pv_a(att_u32 sP, int ks, int lane, att_u32* a) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
    att_ldmatrix_x4(sP + fused_off(16 * mt + (lane & 15), 2 * ks + (lane >> 4), FUSED_BM), a[4 * mt],
                    a[4 * mt + 1], a[4 * mt + 2], a[4 * mt + 3]);
}

// PV B fragments (V, transposed on load): tokens 16 * ks .. +15, value columns
// 64 * warp + 16 * pp .. +15 as two n8 tiles (b[0], b[1] and b[2], b[3]).
__device__ __forceinline__ void fused_pv_b(att_u32 sK, int ks, int pp, int warp, int lane, att_u32* b) {
  const int tok = 16 * ks + 8 * ((lane >> 3) & 1) + (lane & 7);
  att_ldmatrix_x4_trans(sK + fused_off(tok, 8 * warp + 2 * pp + (lane >> 4), FUSED_BN), b[0], b[1], b[2], b[3]);
}

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 1)
verify_fused(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv,
             const int* __restrict__ prefix_lens, const long long* __restrict__ vis,
             att_bf16* __restrict__ out, float* __restrict__ lse, att_bf16* __restrict__ o_part,
             float* __restrict__ lse_part, int B, int S, int N, int H, int W, int splits, int slot0,
             int mode, float scale_log2) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = fused_smem_base(smem_raw);
  float* sRed = reinterpret_cast<float*>(smem + FUSED_SMEM_Q + 2 * FUSED_SMEM_KV + FUSED_SMEM_P);
  float* sAlpha = sRed + 2 * FUSED_BM;
  const att_u32 sQ = att_smem_addr(smem);
  const att_u32 sKV = sQ + FUSED_SMEM_Q;
  const att_u32 sP = sKV + 2 * FUSED_SMEM_KV;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int mg = warp >> 1, ng = warp & 1;  // S = Q K^T: row group, column group
  const FusedBlock k = fused_block(prefix_lens, S, N, H, splits, mode);
  const att_bf16* kvb = kv + (size_t)k.b * S * ATT_D_QK;

  // This thread's two softmax rows (r_lo, r_hi = r_lo + 8) and their visibility rows.
  const int r_lo = 16 * mg + gid, r_hi = r_lo + 8;
  const FusedRows vr = fused_rows(vis, k, N, H, W, r_lo);

  float o[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.f;
  float m_lo = ATT_NEG_INF, m_hi = ATT_NEG_INF, l_lo = 0.f, l_hi = 0.f;

  if (k.kt0 < k.kt1) {  // (fused_load_first, written out: through the helper ptxas spills 4 bytes here)
    fused_load_rows<FUSED_BM>(sQ, q + ((size_t)k.b * k.NH + k.g0) * ATT_D_QK, k.NH - k.g0, tid);
    const int t0 = k.lo + k.kt0 * FUSED_BN;
    fused_load_rows<FUSED_BN>(sKV, kvb + (size_t)t0 * ATT_D_QK, k.hi - t0, tid);
    att_cp_async_commit();
  }

  for (int kt = k.kt0; kt < k.kt1; ++kt) {
    // tile kt landed; every warp is done with tile kt - 1 (its stage, P, alpha)
    const att_u32 sK = fused_next_tile<false>(sKV, kvb, k, kt, tid);

    // S = Q K^T for rows r_lo/r_hi x columns 32 * ng .. +31 (four n8 tiles). The fragments of
    // k-step ks + 1 are loaded before the mma of step ks (two register sets).
    float s[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
    att_u32 qa[2][4], kb[2][8];
    fused_qk_frags(sQ, sK, 0, mg, ng, lane, qa[0], kb[0]);
#pragma unroll
    for (int ks = 0; ks < ATT_D_QK / 16; ++ks) {
      const int cur = ks & 1;
      if (ks + 1 < ATT_D_QK / 16) fused_qk_frags(sQ, sK, ks + 1, mg, ng, lane, qa[cur ^ 1], kb[cur ^ 1]);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) att_mma_bf16(s[nt], qa[cur], kb[cur][2 * nt], kb[cur][2 * nt + 1]);
    }

    float mx_lo, mx_hi;
    fused_scale_mask_max(s, k, k.lo + kt * FUSED_BN, 32 * ng, tig, vr, W, scale_log2, mx_lo, mx_hi);
    if (tig == 0) {
      sRed[ng * FUSED_BM + r_lo] = mx_lo;
      sRed[ng * FUSED_BM + r_hi] = mx_hi;
    }
    __syncthreads();  // both column groups' row maxima are in sRed

    float al_lo, al_hi;
    fused_softmax_store_p(s, fmaxf(sRed[r_lo], sRed[FUSED_BM + r_lo]), fmaxf(sRed[r_hi], sRed[FUSED_BM + r_hi]),
                          m_lo, m_hi, l_lo, l_hi, al_lo, al_hi, sP, r_lo, r_hi, ng, tig);
    if (ng == 0 && tig == 0) {
      sAlpha[r_lo] = al_lo;
      sAlpha[r_hi] = al_hi;
    }
    __syncthreads();  // P and alpha for all 64 rows are in smem

    // O = alpha * O + P V for all 64 rows x value columns 64 * warp .. +63.
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const float a0 = sAlpha[16 * mt + gid], a1 = sAlpha[16 * mt + gid + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
    // 16 steps i = (k-step ks = i / 4, column pair pp = i % 4), fragments one step ahead: P for
    // k-step ks + 1 during the last step of ks, V for step i + 1 during step i.
    att_u32 pa[2][16], vb[2][4];
    fused_pv_a(sP, 0, lane, pa[0]);
    fused_pv_b(sK, 0, 0, warp, lane, vb[0]);
#pragma unroll
    for (int i = 0; i < 4 * (FUSED_BN / 16); ++i) {
      const int ks = i >> 2, pp = i & 3;
      if (i + 1 < 4 * (FUSED_BN / 16)) {
        if (((i + 1) & 3) == 0) fused_pv_a(sP, (i + 1) >> 2, lane, pa[((i + 1) >> 2) & 1]);
        fused_pv_b(sK, (i + 1) >> 2, (i + 1) & 3, warp, lane, vb[(i + 1) & 1]);
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        att_mma_bf16(o[mt][2 * pp], &pa[ks & 1][4 * mt], vb[i & 1][0], vb[i & 1][1]);
        att_mma_bf16(o[mt][2 * pp + 1], &pa[ks & 1][4 * mt], vb[i & 1][2], vb[i & 1][3]);
      }
    }
  }

  // Row sums: reduce over the quad, then over the two column groups through smem.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  __syncthreads();  // every warp is past its last read of sRed / sAlpha
  if (tig == 0) {
    sRed[ng * FUSED_BM + r_lo] = l_lo;
    sRed[ng * FUSED_BM + r_hi] = l_hi;
    if (ng == 0) {
      sAlpha[r_lo] = m_lo;
      sAlpha[r_hi] = m_hi;
    }
  }
  __syncthreads();

#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 16 * mt + gid + 8 * half;
      if (k.g0 + r >= k.NH) continue;
      const float l = sRed[r] + sRed[FUSED_BM + r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        fused_store_pair(out, o_part, k, B, slot0, r, 64 * warp + 8 * nt + 2 * tig, o[mt][nt][2 * half] * inv,
                         o[mt][nt][2 * half + 1] * inv);
    }
  }
  fused_store_lse(lse, lse_part, o_part != nullptr, k, B, slot0, sRed, sAlpha, tid);
}

// out/lse of flat row row0 + blockIdx.y * gridDim.x + blockIdx.x (sequence-major; a (NH, B) grid
// from row 0 covers every row) from `slots` partials, or `tail_slots` from row tail_row on (a
// head/tail launch's tail, fused_block_ht) (o_part [slots, B, NH, 512] normalised bf16, lse_part
// [slots, B, NH] log2). 128 threads x 4 cols.
// Launched with programmatic dependent launch: its blocks may start on the SMs the kernel before
// it leaves free, and wait here until that kernel (the partials' writer) has completed.
// The combine runs after the whole split launch, so its time is the call's: one pass, each chunk
// of COMBINE_CHUNK splits' lse and O slices loaded together (one L2 round trip a chunk, where a
// max pass, a sum pass and a weighted pass cost a round trip each) and merged online. At most 32
// registers a thread, so that 16 blocks fit an SM: B = 1, N = 33, H = 64's 2112 rows in one wave.
#define COMBINE_CHUNK 4
extern "C" __global__ void __launch_bounds__(128, 16)
verify_combine(const att_bf16* __restrict__ o_part, const float* __restrict__ lse_part, att_bf16* __restrict__ out,
               float* __restrict__ lse, int B, int NH, int slots, int row0, int tail_row, int tail_slots) {
  pdl_wait();
  const size_t stride = (size_t)B * NH, row = row0 + (size_t)blockIdx.y * gridDim.x + blockIdx.x;
  if (row >= (size_t)tail_row) slots = tail_slots;
  const int col = 4 * threadIdx.x;
  float m = ATT_NEG_INF, sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < slots; s0 += COMBINE_CHUNK) {
    float l[COMBINE_CHUNK];
    uint2 x[COMBINE_CHUNK];  // 4 bf16 values
#pragma unroll
    for (int j = 0; j < COMBINE_CHUNK; ++j) {
      const size_t slot = (size_t)(s0 + j) * stride + row;
      const bool in = s0 + j < slots;
      l[j] = in ? lse_part[slot] : ATT_NEG_INF;
      x[j] = in ? *reinterpret_cast<const uint2*>(o_part + slot * ATT_D_V + col) : make_uint2(0u, 0u);
    }
    float mc = m;
#pragma unroll
    for (int j = 0; j < COMBINE_CHUNK; ++j) mc = fmaxf(mc, l[j]);
    if (mc == ATT_NEG_INF) continue;  // no visible key in any split so far
    const float r = att_exp2(m - mc);  // 0 while m is -inf
    sum *= r;
    acc.x *= r;
    acc.y *= r;
    acc.z *= r;
    acc.w *= r;
#pragma unroll
    for (int j = 0; j < COMBINE_CHUNK; ++j) {
      const float w = att_exp2(l[j] - mc);
      sum += w;
      acc.x += w * att_bf16_to_f32((att_bf16)(x[j].x & 0xffff));
      acc.y += w * att_bf16_to_f32((att_bf16)(x[j].x >> 16));
      acc.z += w * att_bf16_to_f32((att_bf16)(x[j].y & 0xffff));
      acc.w += w * att_bf16_to_f32((att_bf16)(x[j].y >> 16));
    }
    m = mc;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  *reinterpret_cast<uint2*>(out + row * ATT_D_V + col) =
      make_uint2(att_pack_bf16x2(acc.x * inv, acc.y * inv), att_pack_bf16x2(acc.z * inv, acc.w * inv));
  if (threadIdx.x == 0) lse[row] = sum > 0.f ? (m + att_log2(sum)) * ATT_LN2 : ATT_NEG_INF;
}

#define NAIVE_WARPS 8
#define NAIVE_PAIRS (ATT_D_QK / 64)  // bf16 pairs of a q / kv row per lane (9)
#define NAIVE_VPAIRS (ATT_D_V / 64)  // of them, value pairs (8)

// One block per (head, query, sequence): each warp walks every 8th visible KV row with an
// online softmax, then the 8 warps merge through smem.
extern "C" __global__ void __launch_bounds__(NAIVE_WARPS * 32)
verify_naive(const att_bf16* __restrict__ q, const att_bf16* __restrict__ kv, const int* __restrict__ prefix_lens,
             const long long* __restrict__ vis, att_bf16* __restrict__ out, float* __restrict__ lse, int B, int S,
             int N, int H, int W, float scale_log2) {
  __shared__ float s_m[NAIVE_WARPS], s_l[NAIVE_WARPS];
  __shared__ float s_acc[NAIVE_WARPS][ATT_D_V];
  const int h = blockIdx.x, n = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int p = att_prefix(prefix_lens, b, N, S), hi = p + n + 1;  // tree rows after n: not its ancestors
  const long long* vrow = vis + ((size_t)b * N + n) * W;
  const size_t row = ((size_t)b * N + n) * H + h;

  // Lane holds pairs lane + 32 k of the row (coalesced 4-byte loads); pairs < 256 are values.
  const att_u32* qrow = reinterpret_cast<const att_u32*>(q + row * ATT_D_QK);
  float qf[2 * NAIVE_PAIRS];
#pragma unroll
  for (int k = 0; k < NAIVE_PAIRS; ++k) {
    const att_u32 w = qrow[lane + 32 * k];
    qf[2 * k] = att_bf16_to_f32((att_bf16)(w & 0xffff));
    qf[2 * k + 1] = att_bf16_to_f32((att_bf16)(w >> 16));
  }
  float m = ATT_NEG_INF, l = 0.f, acc[2 * NAIVE_VPAIRS];
#pragma unroll
  for (int i = 0; i < 2 * NAIVE_VPAIRS; ++i) acc[i] = 0.f;

  for (int t = warp; t < hi; t += NAIVE_WARPS) {
    if (t >= p && !att_visible(vrow, t - p)) continue;
    const att_u32* krow = reinterpret_cast<const att_u32*>(kv + ((size_t)b * S + t) * ATT_D_QK);
    float kf[2 * NAIVE_PAIRS], dot = 0.f;
#pragma unroll
    for (int k = 0; k < NAIVE_PAIRS; ++k) {
      const att_u32 w = krow[lane + 32 * k];
      kf[2 * k] = att_bf16_to_f32((att_bf16)(w & 0xffff));
      kf[2 * k + 1] = att_bf16_to_f32((att_bf16)(w >> 16));
      dot += qf[2 * k] * kf[2 * k] + qf[2 * k + 1] * kf[2 * k + 1];
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * scale_log2, mn = fmaxf(m, s);
    const float al = att_exp2(m - mn), pv = att_exp2(s - mn);
    l = l * al + pv;
#pragma unroll
    for (int i = 0; i < 2 * NAIVE_VPAIRS; ++i) acc[i] = acc[i] * al + pv * kf[i];
    m = mn;
  }

#pragma unroll
  for (int k = 0; k < NAIVE_VPAIRS; ++k) {
    s_acc[warp][2 * (lane + 32 * k)] = acc[2 * k];
    s_acc[warp][2 * (lane + 32 * k) + 1] = acc[2 * k + 1];
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
  __syncthreads();
  float M = ATT_NEG_INF;
#pragma unroll
  for (int w = 0; w < NAIVE_WARPS; ++w) M = fmaxf(M, s_m[w]);
  float L = 0.f, x0 = 0.f, x1 = 0.f;
  const int col = 2 * threadIdx.x;
  if (M != ATT_NEG_INF) {
#pragma unroll
    for (int w = 0; w < NAIVE_WARPS; ++w) {
      const float f = att_exp2(s_m[w] - M);
      L += f * s_l[w];
      x0 += f * s_acc[w][col];
      x1 += f * s_acc[w][col + 1];
    }
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  *reinterpret_cast<att_u32*>(out + row * ATT_D_V + col) = att_pack_bf16x2(x0 * inv, x1 * inv);
  if (threadIdx.x == 0) lse[row] = L > 0.f ? (M + att_log2(L)) * ATT_LN2 : ATT_NEG_INF;
}
