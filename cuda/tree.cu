// DDTree tree kernels: best-first tree build, greedy tree accept, KV compaction.
//
// build_tree reproduces the paper's reference heap bit for bit: scores are float64 sums of
// float32 log-probs, the next sibling's score is updated incrementally as (w - lp[r]) + lp[r+1],
// and exact score ties break by the lexicographic order of the path's rank tuple (a prefix
// before its extensions). One block per sequence; one warp runs the heap.
//
// The frontier has a special shape: every popped node owns exactly one "slot", holding its
// next unpopped child (rank r, score w). Popping the best slot's child c creates node n, moves
// the slot to rank r + 1 and opens slot n at rank 0. Slots live in shared memory in groups of
// 32; lane g of the heap warp keeps the best entry of group g in registers. A pop is then one
// warp-wide argmax over the 32 group bests and two group re-scans, each a pair of
// redux.sync max on the order-preserving 64-bit image of the score: no sorting network, no
// sift-down chains through shared memory.
//
// Compile-time options (-D): TOKEN_T (draft token dtype), TARGET_T (target token dtype),
// PLEN_T (prefix length dtype), WORD_T (compaction copy unit), MAX_ACCEPT (L + 1 bound).

#ifndef TOKEN_T
#define TOKEN_T long long
#endif
#ifndef TARGET_T
#define TARGET_T long long
#endif
#ifndef PLEN_T
#define PLEN_T long long
#endif
#ifndef WORD_T
#define WORD_T uint4
#endif
#ifndef MAX_ACCEPT
#define MAX_ACCEPT 33
#endif

#define FULL 0xffffffffu

// Order-preserving image of a double: larger score -> larger unsigned. -0.0 is folded into
// +0.0 first (the reference compares them equal and falls through to the rank tuple).
__device__ __forceinline__ unsigned long long score_key(double w) {
    long long bits = __double_as_longlong(w + 0.0);
    return bits < 0 ? ~(unsigned long long)bits : (unsigned long long)bits | 0x8000000000000000ull;
}

// Does entry (parent slot sa, child rank ra) come before entry (sb, rb) in the lexicographic
// order of rank tuples? Walks parent pointers; only called on exact score ties.
__device__ bool lex_less(int sa, int ra, int sb, int rb, const int* par, const int* rank, const int* depth) {
    int da = depth[sa] + 1, db = depth[sb] + 1;
    const int da0 = da, db0 = db;
    while (da > db) { ra = rank[sa]; sa = par[sa]; --da; }
    while (db > da) { rb = rank[sb]; sb = par[sb]; --db; }
    if (sa == sb && ra == rb) return da0 < db0;  // one is a prefix of the other
    while (sa != sb) { ra = rank[sa]; sa = par[sa]; rb = rank[sb]; sb = par[sb]; }
    return ra < rb;
}

// Warp-wide argmax of (key, then lexicographic rank tuple). Every lane gets the winning lane,
// or -1 when every lane is empty (key 0).
__device__ __forceinline__ int warp_best(unsigned long long key, int slot, int rank,
                                         const int* par, const int* rnk, const int* dep) {
    const unsigned hi = (unsigned)(key >> 32), lo = (unsigned)key;
    const unsigned mhi = __reduce_max_sync(FULL, hi);
    const unsigned mlo = __reduce_max_sync(FULL, hi == mhi ? lo : 0u);
    if (mhi == 0u && mlo == 0u) return -1;
    unsigned ties = __ballot_sync(FULL, hi == mhi && lo == mlo);
    int best = __ffs(ties) - 1;
    ties &= ties - 1;
    if (ties) {  // exact score tie: fall back to the rank tuples (rare on real data)
        int bs = __shfl_sync(FULL, slot, best), br = __shfl_sync(FULL, rank, best);
        while (ties) {
            const int l = __ffs(ties) - 1;
            ties &= ties - 1;
            const int ls = __shfl_sync(FULL, slot, l), lr = __shfl_sync(FULL, rank, l);
            if (lex_less(ls, lr, bs, br, par, rnk, dep)) { best = l; bs = ls; br = lr; }
        }
    }
    return best;
}

// Shared memory (dynamic): lp[L*K] float | slot_w[budget] double | slot_r[budget] int |
// node parent, rank, depth [budget + 1] int.
extern "C" __global__ void __launch_bounds__(256) build_tree(
    const float* __restrict__ logprobs, const TOKEN_T* __restrict__ tokens,
    const TOKEN_T* __restrict__ root_tokens, int has_root, int L, int K, int budget,
    int* __restrict__ out_tokens, int* __restrict__ out_parents, int* __restrict__ out_depth,
    int* __restrict__ out_num, unsigned long long* __restrict__ out_vis) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int b = blockIdx.x, N = budget + 1, W = (N + 63) >> 6, LK = L * K;
    const int tid = threadIdx.x, lane = tid & 31;
    double* slot_w = (double*)smem;
    int* slot_r = (int*)(slot_w + budget);
    int* par = slot_r + budget;
    int* rnk = par + N;
    int* dep = rnk + N;
    float* lp = (float*)(dep + N);
    __shared__ int num_nodes;

    const float* lpb = logprobs + (long long)b * LK;
    for (int i = tid; i < LK; i += blockDim.x) lp[i] = lpb[i];
    if (tid == 0) { par[0] = -1; rnk[0] = -1; dep[0] = 0; }
    __syncthreads();

    if (tid < 32) {
        // Lane g: best entry of slot group g (slots 32g .. 32g+31).
        unsigned long long gkey = 0;
        int gslot = -1, grank = 0;
        if (lane == 0) {
            const double w0 = 0.0 + (double)lp[0];
            slot_w[0] = w0; slot_r[0] = 0;
            gkey = score_key(w0); gslot = 0;
        }
        int cnt = 1;
        __syncwarp();
        while (cnt <= budget) {
            const int wl = warp_best(gkey, gslot, grank, par, rnk, dep);
            if (wl < 0) break;  // the heap ran dry: fewer prefixes than the budget
            const int s = __shfl_sync(FULL, gslot, wl);
            const int r = slot_r[s], d = dep[s];
            const double w = slot_w[s];
            const int n = cnt++;
            // Next sibling of the popped child, and the popped child's own first child.
            const bool s_ok = r + 1 < K;
            const double ws = s_ok ? (w - (double)lp[d * K + r]) + (double)lp[d * K + r + 1] : 0.0;
            const bool has_slot_n = n < budget;
            const bool n_ok = has_slot_n && d + 1 < L;
            const double wn = n_ok ? w + (double)lp[(d + 1) * K] : 0.0;
            // Re-scan the one or two groups that changed, reading the new values from
            // registers (lane 0 publishes them to shared memory below).
            const int g1 = s >> 5, g2 = has_slot_n ? n >> 5 : g1;
            unsigned long long k1 = 0, k2 = 0;
            int r1 = 0, r2 = 0;
            {
                const int i = (g1 << 5) + lane;
                if (i == s) { k1 = s_ok ? score_key(ws) : 0; r1 = r + 1; }
                else if (i == n) { k1 = n_ok ? score_key(wn) : 0; r1 = 0; }
                else if (i < n && i < budget && slot_r[i] < K) { k1 = score_key(slot_w[i]); r1 = slot_r[i]; }
            }
            {
                const int i = (g2 << 5) + lane;
                if (i == s) { k2 = s_ok ? score_key(ws) : 0; r2 = r + 1; }
                else if (i == n) { k2 = n_ok ? score_key(wn) : 0; r2 = 0; }
                else if (i < n && i < budget && slot_r[i] < K) { k2 = score_key(slot_w[i]); r2 = slot_r[i]; }
            }
            __syncwarp();  // every lane has read slot s before lane 0 rewrites it
            if (lane == 0) {
                par[n] = s; rnk[n] = r; dep[n] = d + 1;
                slot_r[s] = s_ok ? r + 1 : K; slot_w[s] = ws;
                if (has_slot_n) { slot_r[n] = n_ok ? 0 : K; slot_w[n] = wn; }
            }
            __syncwarp();  // node n's parent/rank/depth are visible to the tie-break walks
            const int b1 = warp_best(k1, (g1 << 5) + lane, r1, par, rnk, dep);
            const int b2 = warp_best(k2, (g2 << 5) + lane, r2, par, rnk, dep);
            const unsigned long long bk1 = __shfl_sync(FULL, k1, b1 < 0 ? 0 : b1);
            const unsigned long long bk2 = __shfl_sync(FULL, k2, b2 < 0 ? 0 : b2);
            const int br1 = __shfl_sync(FULL, r1, b1 < 0 ? 0 : b1);
            const int br2 = __shfl_sync(FULL, r2, b2 < 0 ? 0 : b2);
            if (lane == g1) { gkey = b1 < 0 ? 0 : bk1; gslot = (g1 << 5) + b1; grank = br1; }
            if (lane == g2) { gkey = b2 < 0 ? 0 : bk2; gslot = (g2 << 5) + b2; grank = br2; }
        }
        if (lane == 0) num_nodes = cnt;
    }
    __syncthreads();

    const int num = num_nodes;
    const long long row = (long long)b * N;
    for (int i = tid; i < N; i += blockDim.x) {
        int tok = -1, p = -1, dd = -1;
        if (i == 0) { tok = has_root ? (int)root_tokens[b] : -1; dd = 0; }
        else if (i < num) {
            p = par[i]; dd = dep[i];
            tok = (int)tokens[(long long)b * LK + (long long)(dd - 1) * K + rnk[i]];
        }
        out_tokens[row + i] = tok; out_parents[row + i] = p; out_depth[row + i] = dd;
        // Visibility row i: ancestors have decreasing indices along the walk, so the words
        // fill from the highest down; padding rows are all zero.
        unsigned long long* v = out_vis + (row + i) * W;
        int w = W - 1;
        unsigned long long acc = 0;
        for (int a = i < num ? i : -1; a >= 0; a = par[a]) {
            while ((a >> 6) < w) { v[w--] = acc; acc = 0; }
            acc |= 1ull << (a & 63);
        }
        for (; w >= 0; --w) { v[w] = acc; acc = 0; }
    }
    if (tid == 0) out_num[b] = num;
}

// Greedy acceptance: from the root, move to the first child (lowest node index) whose token
// equals the target's choice at the current node. One block per sequence.
extern "C" __global__ void __launch_bounds__(256) accept_tree(
    const int* __restrict__ tokens, const int* __restrict__ parents, const int* __restrict__ num_nodes,
    const TARGET_T* __restrict__ target, int N, int max_len,
    int* __restrict__ out_indices, int* __restrict__ out_length, int* __restrict__ out_bonus) {
    extern __shared__ int first_child[];  // [N]: lowest-index child matching the target
    __shared__ int path[MAX_ACCEPT];
    __shared__ int path_len;
    const int b = blockIdx.x, tid = threadIdx.x;
    const long long row = (long long)b * N;
    const int num = num_nodes[b];
    for (int i = tid; i < N; i += blockDim.x) first_child[i] = 0x7fffffff;
    __syncthreads();
    for (int j = 1 + tid; j < num; j += blockDim.x) {
        const int p = parents[row + j];
        if ((long long)tokens[row + j] == (long long)target[row + p]) atomicMin(&first_child[p], j);
    }
    __syncthreads();
    if (tid == 0) {
        int cur = 0, len = 1;
        path[0] = 0;
        while (len < max_len && first_child[cur] != 0x7fffffff) { cur = first_child[cur]; path[len++] = cur; }
        path_len = len;
        out_length[b] = len;
        out_bonus[b] = (int)target[row + cur];
    }
    __syncthreads();
    for (int i = tid; i < max_len; i += blockDim.x) out_indices[(long long)b * max_len + i] = i < path_len ? path[i] : -1;
}

// KV compaction: row prefix_lens[b] + i <- row prefix_lens[b] + indices[b, i], i < length[b],
// in place. Each thread owns one column (a WORD_T) of one sequence and layer, reads every
// accepted row of it into registers before writing any, so in-place moves are safe.
// Grid: (ceil(row_words / blockDim), B, layers). Strides are in WORD_T units.
extern "C" __global__ void compact_kv(
    WORD_T* __restrict__ kv, long long layer_stride, long long batch_stride, long long row_stride,
    int row_words, const PLEN_T* __restrict__ prefix_lens, const int* __restrict__ indices,
    const int* __restrict__ length, int max_len) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= row_words) return;
    WORD_T* base = kv + blockIdx.z * layer_stride + b * batch_stride + (long long)prefix_lens[b] * row_stride + c;
    const int len = length[b];
    const int* idx = indices + (long long)b * max_len;
    WORD_T vals[MAX_ACCEPT];
#pragma unroll
    for (int i = 0; i < MAX_ACCEPT; ++i)
        if (i < len && idx[i] != i) vals[i] = base[(long long)idx[i] * row_stride];
#pragma unroll
    for (int i = 0; i < MAX_ACCEPT; ++i)
        if (i < len && idx[i] != i) base[(long long)i * row_stride] = vals[i];
}
