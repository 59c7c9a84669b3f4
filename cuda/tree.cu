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
// redux.sync max on the order-preserving 64-bit image of the score, plus one over the other
// groups' bests, all three independent: no sorting network, no sift-down chains.
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
// 0 never occurs for a finite score, so it marks an empty entry.
__device__ __forceinline__ unsigned long long score_key(double w) {
    long long bits = __double_as_longlong(w + 0.0);
    return bits < 0 ? ~(unsigned long long)bits : (unsigned long long)bits | 0x8000000000000000ull;
}

// Does entry (parent slot sa, child rank ra) come before entry (sb, rb) in the lexicographic
// order of rank tuples? Walks parent pointers; only reached on exact score ties.
__device__ bool lex_less(int sa, int ra, int sb, int rb, const int* par, const int* rank, const int* depth) {
    int da = depth[sa] + 1, db = depth[sb] + 1;
    const int da0 = da, db0 = db;
    while (da > db) { ra = rank[sa]; sa = par[sa]; --da; }
    while (db > da) { rb = rank[sb]; sb = par[sb]; --db; }
    if (sa == sb && ra == rb) return da0 < db0;  // one is a prefix of the other
    while (sa != sb) { ra = rank[sa]; sa = par[sa]; rb = rank[sb]; sb = par[sb]; }
    return ra < rb;
}

// Inverse of score_key for non-empty keys (exact: the map is a bijection on finite doubles).
__device__ __forceinline__ double key_score(unsigned long long k) {
    return __longlong_as_double((long long)((k >> 63) ? (k & 0x7fffffffffffffffull) : ~k));
}

// One frontier entry: the next unpopped child (rank `rank`) of node `slot` at depth `dep`,
// its score folded into `key` (0 = empty) and the rest packed in 32 bits
// (slot: 11 bits, rank: 11 bits, depth: 6 bits), so a shuffle or select moves 3 registers.
struct Entry {
    unsigned long long key;
    unsigned info;
};
__device__ __forceinline__ unsigned pack(int slot, int rank, int dep) { return slot | (rank << 11) | (dep << 22); }
__device__ __forceinline__ int e_slot(unsigned i) { return i & 2047; }
__device__ __forceinline__ int e_rank(unsigned i) { return (i >> 11) & 2047; }
__device__ __forceinline__ int e_dep(unsigned i) { return i >> 22; }

__device__ __forceinline__ Entry shfl_entry(Entry e, int src) {
    return Entry{__shfl_sync(FULL, e.key, src), __shfl_sync(FULL, e.info, src)};
}

// Field-wise select (keeps entries in registers; a struct-valued ?: can go to local memory).
__device__ __forceinline__ Entry pick(bool c, Entry a, Entry b) {
    return Entry{c ? a.key : b.key, c ? a.info : b.info};
}

// The heap's order: larger key first, then the smaller rank tuple.
__device__ __forceinline__ bool before(Entry a, Entry b, const int* par, const int* rnk, const int* dep) {
    if (a.key != b.key) return a.key > b.key;
    return a.key != 0 && lex_less(e_slot(a.info), e_rank(a.info), e_slot(b.info), e_rank(b.info), par, rnk, dep);
}

// Warp-wide best entry (every lane gets it; key 0 if all are empty). The common case is one
// redux.sync on the high word; equal high words take a second one on the low word, and exact
// score ties compare rank tuples through a shared-memory scratch, outside any collective.
__device__ __forceinline__ Entry warp_best(Entry e, unsigned* scratch, const int* par, const int* rnk, const int* dep) {
    const int lane = threadIdx.x & 31;
    const unsigned hi = (unsigned)(e.key >> 32);
    const unsigned mhi = __reduce_max_sync(FULL, hi);
    unsigned ties = __ballot_sync(FULL, hi == mhi);
    if (__popc(ties) > 1) {
        const unsigned lo = (unsigned)e.key;
        const unsigned mlo = __reduce_max_sync(FULL, hi == mhi ? lo : 0u);
        ties = __ballot_sync(FULL, hi == mhi && lo == mlo);
    }
    int best = __ffs(ties) - 1;
    if (__popc(ties) > 1 && mhi != 0u) {
        scratch[lane] = e.info;
        __syncwarp();
        for (unsigned t = ties & (ties - 1); t; t &= t - 1) {
            const int l = __ffs(t) - 1;
            const unsigned a = scratch[l], b = scratch[best];
            if (lex_less(e_slot(a), e_rank(a), e_slot(b), e_rank(b), par, rnk, dep)) best = l;
        }
        __syncwarp();
    }
    return shfl_entry(e, best);
}

// Slot i as a frontier entry, with the two slots this pop changed (es = slot s, en = the new
// slot n) taken from registers rather than shared memory.
__device__ __forceinline__ Entry scan_slot(int i, int s, Entry es, Entry en, int n, int budget,
                                           const unsigned long long* slot_key, const unsigned* slot_info) {
    const bool live = i != s && i < n && i < budget;
    Entry e{live ? slot_key[i] : 0ull, live ? slot_info[i] : 0u};
    e = pick(i == s, es, e);
    return pick(i == n, en, e);
}

// Shared memory (dynamic): slot_key[budget] u64 | slot_info[budget] u32 | node parent, rank,
// depth [budget + 1] int | (pad to 16 B) lp[L*K] float. One warp per block: the heap's collectives are then
// provably convergent, so ptxas emits plain REDUX/VOTE/SHFL (no WARPSYNC.COLLECTIVE loops).
extern "C" __global__ void __launch_bounds__(32) build_tree(
    const float* __restrict__ logprobs, const TOKEN_T* __restrict__ tokens,
    const TOKEN_T* __restrict__ root_tokens, int has_root, int L, int K, int budget,
    int* __restrict__ out_tokens, int* __restrict__ out_parents, int* __restrict__ out_depth,
    int* __restrict__ out_num, unsigned long long* __restrict__ out_vis) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned scratch[3][32];
    const int b = blockIdx.x, N = budget + 1, W = (N + 63) >> 6, LK = L * K;
    const int lane = threadIdx.x;
    unsigned long long* slot_key = (unsigned long long*)smem;
    unsigned* slot_info = (unsigned*)(slot_key + budget);
    int* par = (int*)(slot_info + budget);
    int* rnk = par + N;
    int* dep = rnk + N;
    // lp at the next 16-byte boundary (float4 staging); offset arithmetic on the shared pointer
    // itself keeps the loads LDS (an integer round trip would make them generic LD).
    float* lp = (float*)(smem + ((((unsigned char*)(dep + N) - smem) + 15) & ~15));

    const float* lpb = logprobs + (long long)b * LK;
    if ((LK & 3) == 0 && ((size_t)lp & 15) == 0) {
        const float4* src = (const float4*)lpb;
        float4* dst = (float4*)lp;
#pragma unroll 8
        for (int i = lane; i < (LK >> 2); i += 32) dst[i] = __ldg(src + i);
    } else {
        for (int i = lane; i < LK; i += 32) lp[i] = __ldg(lpb + i);
    }
    const Entry empty{0ull, 0u};
    // The root is node 0; its first child sits in slot 0.
    Entry best{score_key(0.0 + (double)__ldg(lpb)), pack(0, 0, 0)};
    Entry mine = pick(lane == 0, best, empty);  // lane g: best entry of slot group g (slots 32g..32g+31)
    if (lane == 0) { par[0] = -1; rnk[0] = -1; dep[0] = 0; slot_key[0] = best.key; slot_info[0] = best.info; }
    __syncwarp();

    int cnt = 1;
    while (cnt <= budget && best.key != 0ull) {
        const int s = e_slot(best.info), r = e_rank(best.info), d = e_dep(best.info), n = cnt++;
        const double w = key_score(best.key);
        // The popped child becomes node n. Its slot s moves on to the next sibling; node n
        // opens its own slot with its first child.
        const Entry es{r + 1 < K ? score_key((w - (double)lp[d * K + r]) + (double)lp[d * K + r + 1]) : 0ull,
                       pack(s, r + 1, d)};
        const bool has_slot_n = n < budget;
        const Entry en{has_slot_n && d + 1 < L ? score_key(w + (double)lp[(d + 1) * K]) : 0ull, pack(n, 0, d + 1)};
        if (lane == 0) { par[n] = s; rnk[n] = r; dep[n] = d + 1; }
        __syncwarp();  // node n is visible to the tie-break walks below
        // Re-scan the one or two slot groups that changed; the other groups' bests stand.
        const int g1 = s >> 5, g2 = has_slot_n ? n >> 5 : g1;
        const Entry rest = warp_best(pick(lane == g1 || lane == g2, empty, mine), scratch[0], par, rnk, dep);
        const Entry b1 = warp_best(scan_slot((g1 << 5) + lane, s, es, en, n, budget, slot_key, slot_info), scratch[1], par, rnk, dep);
        const Entry b2 = warp_best(scan_slot((g2 << 5) + lane, s, es, en, n, budget, slot_key, slot_info), scratch[2], par, rnk, dep);
        mine = pick(lane == g1, b1, mine);
        mine = pick(lane == g2, b2, mine);
        best = pick(before(b1, rest, par, rnk, dep), b1, rest);
        best = pick(before(b2, best, par, rnk, dep), b2, best);
        __syncwarp();  // every lane has read the slots before lane 0 rewrites two of them
        if (lane == 0) {
            slot_key[s] = es.key; slot_info[s] = es.info;
            if (has_slot_n) { slot_key[n] = en.key; slot_info[n] = en.info; }
        }
        __syncwarp();
    }
    const int num = cnt;
    __syncwarp();

    const long long row = (long long)b * N;
    for (int i = lane; i < N; i += 32) {
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
    if (lane == 0) out_num[b] = num;
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
