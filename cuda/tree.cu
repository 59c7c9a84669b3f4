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

// ---------------------------------------------------------------------------------------------
// The serial heap (v5), the exact fallback. Runs on warp 0; the others wait at the caller's
// barrier. Region layout: slot_key[budget] u64 | slot_info[budget] u32; node arrays par, rnk,
// dep [budget + 1] come from the caller. Returns the node count, root included.
// ---------------------------------------------------------------------------------------------
__device__ int serial_build(const float* lp, int L, int K, int budget, unsigned char* region,
                            int* par, int* rnk, int* dep, unsigned (*scratch)[32]) {
    const int lane = threadIdx.x & 31;
    unsigned long long* slot_key = (unsigned long long*)region;
    unsigned* slot_info = (unsigned*)(slot_key + budget);
    const Entry empty{0ull, 0u};
    // The root is node 0; its first child sits in slot 0.
    Entry best{score_key(0.0 + (double)lp[0]), pack(0, 0, 0)};
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
    return cnt;
}

// ---------------------------------------------------------------------------------------------
// The parallel path (v6). When every score the heap would compute is an exact sum (float32
// log-probs summed in float64 rarely round: that needs a path sum ~2^29 times its smallest
// term), the heap's scores are the exact path sums, which never increase from a node to its
// first child (rows <= 0) or its next sibling (rows sorted). The heap then pops the nodes in
// (score desc, rank tuple asc) order, and its first `budget` pops are the top-`budget` nodes
// of that order. So: find a threshold theta with budget <= #{nodes >= theta} <= cap, list
// those nodes level by level (per parent, the children >= theta are a rank prefix, found by
// binary search), sort the list, keep the first `budget`. Each warp of the block evaluates one
// threshold; a round bisects the bracket eight ways. Any doubt (a rounded sum, a non-finite
// or unsorted row, a positive log-prob, no threshold found) hands the sequence to the heap.
// ---------------------------------------------------------------------------------------------
#define NWARPS 8
#define MAX_ROUNDS 8
// -DTREE_PROFILE: out_path is int [B, 8]: path, rounds, list length, then clock64 offsets from
// the kernel start at the end of staging, of the rounds, of the sort, of the checks and at exit.
#ifdef TREE_PROFILE
__shared__ long long prof_t0;
__shared__ int prof[8];
#define PROF_MARK(i) do { if (threadIdx.x == 0) prof[i] = (int)(clock64() - prof_t0); } while (0)
#else
#define PROF_MARK(i) do {} while (0)
#endif
#define NO_PARENT 0xffff

// Is a + b exact in float64? (Knuth's TwoSum error term.)
__device__ __forceinline__ bool exact_sum(double a, double b, double s) {
    const double bb = s - a;
    return (a - (s - bb)) + (b - bb) == 0.0;
}

// One warp lists every node whose score is >= theta into (ekey, epar, erd): score, parent
// entry (NO_PARENT for the root) and rank | depth << 10, parents before children, each
// parent's children contiguous in rank order. Returns the count, cap + 1 once it exceeds cap,
// or -1 once a higher warp's threshold (`*done`) has listed between budget and cap nodes.
__device__ int enumerate_nodes(double theta, const float* lp, int L, int K, int cap, double* ekey,
                               unsigned short* epar, unsigned short* erd, int* scan, bool* inexact,
                               int* done) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int a = 0, b = 1, cum = 0;  // parents of the current level: entries [a, b); level 0: the root
    bool rounded = false;
    for (int d = 0; d < L && a < b; ++d) {
        const float* row = lp + d * K;
        const int level_start = cum;
        for (int base = a; base < b; base += 32) {
            // A higher threshold already holds a usable list: this one cannot win; stop.
            if (__shfl_sync(FULL, lane == 0 ? atomicAdd((int*)done, 0) : -1, 0) > warp) return -1;
            const int p = base + lane;
            const double w = d == 0 ? 0.0 : (p < b ? ekey[p] : 0.0);
            // Children >= theta: a rank prefix. Most parents keep few children, so gallop
            // (ranks 0, 1, 3, 7, ...) before bisecting.
            int c = 0;
            if (p < b && w + (double)row[0] >= theta) {
                int ok = 0, probe = 1;
                while (probe < K && w + (double)row[probe] >= theta) { ok = probe; probe = 2 * probe + 1; }
                int lo = ok + 1, hi = probe < K ? probe : K;
                while (lo < hi) {
                    const int mid = (lo + hi) >> 1;
                    if (w + (double)row[mid] >= theta) lo = mid + 1; else hi = mid;
                }
                c = lo;
            }
            int incl = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int t = __shfl_up_sync(FULL, incl, o);
                if (lane >= o) incl += t;
            }
            const int total = __shfl_sync(FULL, incl, 31);
            if (cum + total > cap) return cap + 1;
            scan[lane] = incl;
            __syncwarp();
            for (int o = lane; o < total; o += 32) {
                int lo = 0, hi = 31;  // the first lane whose inclusive count exceeds o
                while (lo < hi) {
                    const int mid = (lo + hi) >> 1;
                    if (scan[mid] > o) hi = mid; else lo = mid + 1;
                }
                const int j = o - (lo ? scan[lo - 1] : 0), q = base + lo;
                const double pw = d == 0 ? 0.0 : ekey[q];
                const double key = pw + (double)row[j];
                rounded |= !exact_sum(pw, (double)row[j], key);
                ekey[cum + o] = key;
                epar[cum + o] = d == 0 ? NO_PARENT : (unsigned short)q;
                erd[cum + o] = (unsigned short)(j | ((d + 1) << 10));
            }
            cum += total;
            __syncwarp();
        }
        a = level_start;
        b = cum;
    }
    *inexact = __any_sync(FULL, rounded);
    return cum;
}

// Rank-tuple order of two listed nodes (a prefix before its extensions).
__device__ bool entry_lex_less(int a, int b, const unsigned short* epar, const unsigned short* erd) {
    const int da0 = erd[a] >> 10, db0 = erd[b] >> 10;
    int da = da0, db = db0;
    while (da > db) { a = epar[a]; --da; }
    while (db > da) { b = epar[b]; --db; }
    if (a == b) return da0 < db0;
    while (epar[a] != epar[b]) { a = epar[a]; b = epar[b]; }
    return (erd[a] & 1023) < (erd[b] & 1023);
}

// Does list entry (key ka, index xa) pop before (kb, xb)? Padding (index >= M, key 0) pops
// last; equal keys (rare) fall to the rank tuple.
__device__ __forceinline__ bool pops_first(unsigned long long ka, int xa, unsigned long long kb, int xb, int M,
                                           const unsigned short* epar, const unsigned short* erd) {
    if (ka != kb) return ka > kb;
    if (xa >= M || xb >= M) return xb >= M && xa < M;
    return entry_lex_less(xa, xb, epar, erd);
}

// The parallel path. Returns the node count (root included) with par/rnk/dep filled, or 0 to
// ask for the heap. `area` holds NWARPS lists of `cap` entries (12 bytes each).
__device__ int parallel_build(const float* lp, int L, int K, int budget, int cap, unsigned char* area,
                              int** par_out, int** rnk_out, int** dep_out) {
    __shared__ double pivot[NWARPS], lo_s, hi_s;
    __shared__ int count[NWARPS], inexact_s[NWARPS], winner, exhausted, done, scan_s[NWARPS][32];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t list_bytes = (size_t)cap * 12;
    auto list = [&](int w, double** k, unsigned short** p, unsigned short** r) {
        unsigned char* base = area + w * list_bytes;
        *k = (double*)base;
        *p = (unsigned short*)(base + (size_t)cap * 8);
        *r = *p + cap;
    };
    if (tid == 0) {
        // Bracket: hi = the best score; lo = the sum of the row minima over the fewest levels
        // holding >= budget nodes (every node there scores >= lo, so #{>= lo} >= budget). A
        // tree with at most `budget` nodes is listed whole (the heap runs dry on it too).
        double lo = 0.0;
        long long total = 0, width = 1;
        bool enough = false;
        for (int d = 0; d < L && !enough; ++d) {
            width = width * K > (1ll << 40) ? (1ll << 40) : width * K;
            total += width;
            lo += (double)lp[d * K + K - 1];
            enough = total > budget;
        }
        exhausted = !enough;
        lo_s = enough ? lo : -__longlong_as_double(0x7ff0000000000000ll);  // -inf
        hi_s = (double)lp[0];
        winner = -1;
        done = -1;
    }
    __syncthreads();
    // Round 0 tries lo and seven thresholds above it; later rounds split (lo, hi) eight ways,
    // knowing #{>= lo} > cap and #{>= hi} < budget (or hi the best score).
    for (int round = 0; round < MAX_ROUNDS && winner < 0; ++round) {
        const double lo = lo_s, hi = hi_s;
        const double f = round == 0 ? warp * (1.0 / NWARPS) : (warp + 1) * (1.0 / (NWARPS + 1));
        const double theta = exhausted ? lo : lo + (hi - lo) * f;
        double* k; unsigned short *p, *r;
        list(warp, &k, &p, &r);
        bool inexact = false;
        const int c = (exhausted && warp > 0) ? 0 : enumerate_nodes(theta, lp, L, K, cap, k, p, r, scan_s[warp], &inexact, &done);
        if (lane == 0) {
            pivot[warp] = theta; count[warp] = c; inexact_s[warp] = inexact;
            if (c >= budget && c <= cap) atomicMax(&done, warp);
        }
        __syncthreads();
#ifdef TREE_PROFILE
        if (tid == 0) prof[1] = round + 1;
#endif
        if (tid == 0) {
            // The highest threshold holding >= budget nodes (stopped warps, -1, sit below it).
            int w = exhausted ? 0 : NWARPS - 1;
            while (w >= 0 && count[w] < budget) --w;
            if (w >= 0 && count[w] <= cap) {
                winner = w;
            } else {
                const double nlo = w >= 0 ? pivot[w] : lo, nhi = w < 0 ? pivot[0] : (w + 1 < NWARPS ? pivot[w + 1] : hi);
                if (nlo < nhi && (nlo != lo || nhi != hi)) { lo_s = nlo; hi_s = nhi; }
                else winner = -2;  // the bracket cannot shrink: ties straddle every threshold
            }
        }
        __syncthreads();
    }
    const int win = winner;
#ifdef TREE_PROFILE
    if (tid == 0) prof[2] = win >= 0 ? count[win] : -1;
#endif
    PROF_MARK(4);
    if (win < 0 || inexact_s[win]) return 0;

    double* ekey; unsigned short *epar, *erd;
    list(win, &ekey, &epar, &erd);
    const int M = count[win], S = M < budget ? M : budget;
    // Scratch: the four lists on the other side of the winner's (48 * cap bytes; this needs
    // 24 * P + 4 * M + 12 * (budget + 1) <= 40 * cap + 12).
    unsigned char* scratch = area + (win < NWARPS / 2 ? NWARPS / 2 : 0) * list_bytes;
    // Sort into pop order. Long lists: merge sort, runs of 8 sorted in registers, then merge
    // levels, each output chunk of 8 placed by a merge-path search; P pads M to a multiple of 8
    // (key 0 pops last).
    const int P = (M + 7) & ~7;
    unsigned long long* ka = (unsigned long long*)scratch;
    unsigned long long* kb = ka + P;
    int* ia = (int*)(kb + P);
    int* ib = ia + P;
    int* pos = ib + P;
    int* par = pos + M;
    int* rnk = par + (budget + 1);
    int* dep = rnk + (budget + 1);
    for (int i = tid; i < M; i += blockDim.x) pos[i] = -1;
    if (M <= (int)blockDim.x) {
        // Short lists: rank by counting (thread e counts the entries that pop before entry e).
        for (int i = tid; i < M; i += blockDim.x) ka[i] = score_key(ekey[i]);
        __syncthreads();
        if (tid < M) {
            const unsigned long long mine = ka[tid];
            int rank = 0, equal = 0;
#pragma unroll 4
            for (int j = 0; j < M; ++j) { const unsigned long long kj = ka[j]; rank += kj > mine; equal += kj == mine; }
            if (equal > 1)  // exact score ties: the rank tuple decides
                for (int j = 0; j < M; ++j) rank += j != tid && ka[j] == mine && entry_lex_less(j, tid, epar, erd);
            ib[rank] = tid;
        }
        __syncthreads();
        ia = ib;
    } else {
        for (int r = tid; r < P / 8; r += blockDim.x) {
            unsigned long long k[8];
            int x[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) { x[q] = 8 * r + q; k[q] = x[q] < M ? score_key(ekey[x[q]]) : 0ull; }
#pragma unroll
            for (int q = 1; q < 8; ++q)  // insertion sort, unrolled: compare-swaps in registers
#pragma unroll
                for (int t = q; t > 0; --t)
                    if (pops_first(k[t], x[t], k[t - 1], x[t - 1], M, epar, erd)) {
                        const unsigned long long kk = k[t]; k[t] = k[t - 1]; k[t - 1] = kk;
                        const int xx = x[t]; x[t] = x[t - 1]; x[t - 1] = xx;
                    }
#pragma unroll
            for (int q = 0; q < 8; ++q) { ka[8 * r + q] = k[q]; ia[8 * r + q] = x[q]; }
        }
        __syncthreads();
        for (int width = 8; width < P; width <<= 1) {
            for (int c = tid; c < P / 8; c += blockDim.x) {
                const int o = 8 * c, lo = o / (2 * width) * (2 * width);
                const int a0 = lo, na = min(width, P - lo), b0 = lo + na, nb = min(width, P - b0 > 0 ? P - b0 : 0);
                const int diag = o - lo;
                // Merge path: the split (i from A, diag - i from B) of the first diag outputs.
                int l = max(0, diag - nb), h = min(diag, na);
                while (l < h) {
                    const int m = (l + h) >> 1;
                    if (pops_first(ka[b0 + diag - m - 1], ia[b0 + diag - m - 1], ka[a0 + m], ia[a0 + m], M, epar, erd)) h = m;
                    else l = m + 1;
                }
                int i = l, j = diag - l;
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const bool take_b = i >= na || (j < nb && pops_first(ka[b0 + j], ia[b0 + j], ka[a0 + i], ia[a0 + i], M, epar, erd));
                    const int src = take_b ? b0 + j : a0 + i;
                    kb[o + q] = ka[src]; ib[o + q] = ia[src];
                    if (take_b) ++j; else ++i;
                }
            }
            __syncthreads();
            unsigned long long* tk = ka; ka = kb; kb = tk;
            int* ti = ia; ia = ib; ib = ti;
        }
    }
    for (int n = tid; n < S; n += blockDim.x) pos[ia[n]] = n + 1;
    int* sidx = ia;
    PROF_MARK(5);
    __syncthreads();
    // Node arrays, and the checks that make the heap pop exactly this sequence: parents kept
    // and earlier, and every score the heap computes on the kept nodes' frontier exact.
    int bad = 0;
    for (int n = tid; n < S; n += blockDim.x) {
        const int e = sidx[n], pe = epar[e], d = erd[e] >> 10, rr = erd[e] & 1023;
        const int pn = pe == NO_PARENT ? 0 : pos[pe];
        bad |= pn < 0 || pn > n;
        par[n + 1] = pn; rnk[n + 1] = rr; dep[n + 1] = d;
        const double pw = pe == NO_PARENT ? 0.0 : ekey[pe];
        if (rr + 1 < K) {
            const double x = (double)lp[(d - 1) * K + rr + 1];
            bad |= !exact_sum(pw, x, pw + x);
        }
        if (d < L) {
            const double x = (double)lp[d * K];
            bad |= !exact_sum(ekey[e], x, ekey[e] + x);
        }
    }
    if (tid == 0) { par[0] = -1; rnk[0] = -1; dep[0] = 0; }
    if (__syncthreads_or(bad)) return 0;
    PROF_MARK(6);
    *par_out = par; *rnk_out = rnk; *dep_out = dep;
    return S + 1;
}

// Path taken per sequence (out_path, optional): 0 parallel; fallbacks 1 (input outside the
// parallel path's preconditions), 2 (no threshold found or a rounded sum), 3 (serial requested).
//
// Shared memory (dynamic): lp[L*K] float (16-byte aligned) | region, of max(serial layout,
// NWARPS * cap * 12) bytes; the serial layout is slot_key[budget] u64 | slot_info[budget] u32 |
// par, rnk, dep [budget + 1] int. Launch with NWARPS warps (cap > 0) or one warp (serial only).
extern "C" __global__ void __launch_bounds__(NWARPS * 32) build_tree(
    const float* __restrict__ logprobs, const TOKEN_T* __restrict__ tokens,
    const TOKEN_T* __restrict__ root_tokens, int has_root, int L, int K, int budget, int cap,
    int* __restrict__ out_tokens, int* __restrict__ out_parents, int* __restrict__ out_depth,
    int* __restrict__ out_num, unsigned long long* __restrict__ out_vis, int* __restrict__ out_path) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned scratch[3][32];
    __shared__ int num_s;
    const int b = blockIdx.x, N = budget + 1, W = (N + 63) >> 6, LK = L * K, tid = threadIdx.x;
#ifdef TREE_PROFILE
    if (tid == 0) prof_t0 = clock64();
#endif
    float* lp = (float*)smem;
    unsigned char* region = smem + ((LK * 4 + 15) & ~15);

    const float* lpb = logprobs + (long long)b * LK;
    if ((LK & 3) == 0) {
        const float4* src = (const float4*)lpb;
        float4* dst = (float4*)lp;
#pragma unroll 4
        for (int i = tid; i < (LK >> 2); i += blockDim.x) dst[i] = __ldg(src + i);
    } else {
        for (int i = tid; i < LK; i += blockDim.x) lp[i] = __ldg(lpb + i);
    }
    __syncthreads();
    const bool parallel = cap > 0 && blockDim.x == NWARPS * 32;
    int path = 3, num = 0;
    int *par = nullptr, *rnk = nullptr, *dep = nullptr;
    if (parallel) {
        // Preconditions of the parallel path: finite, rows sorted, every row's best <= 0.
        int bad = 0;
        for (int d = 0; d < L; ++d) {
            const float* row = lp + d * K;
            for (int j = tid; j < K; j += blockDim.x) {
                const float x = row[j];
                bad |= !isfinite(x) || (j + 1 < K && row[j + 1] > x) || (j == 0 && x > 0.0f);
            }
        }
        path = __syncthreads_or(bad) ? 1 : 2;
        PROF_MARK(3);
        if (path == 2) {
            num = parallel_build(lp, L, K, budget, cap, region, &par, &rnk, &dep);
            if (num > 0) path = 0;
        }
        __syncthreads();
    }
    if (path != 0) {
        par = (int*)(region + (size_t)budget * 12);
        rnk = par + N;
        dep = rnk + N;
        if (tid < 32) {
            const int n = serial_build(lp, L, K, budget, region, par, rnk, dep, scratch);
            if (tid == 0) num_s = n;
        }
        __syncthreads();
        num = num_s;
    }

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
#ifdef TREE_PROFILE
    __syncthreads();
    PROF_MARK(7);
    if (tid == 0) { prof[0] = path; for (int i = 0; i < 8; ++i) out_path[b * 8 + i] = prof[i]; }
    if (tid == 0) out_num[b] = num;
#else
    if (tid == 0) {
        out_num[b] = num;
        if (out_path) out_path[b] = path;
    }
#endif
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
// Grid: (ceil(row_words / blockDim), B, layers). Strides are in WORD_T units; rows = S, the
// cache rows per sequence.
// Bounds guard: whatever it is given, the kernel touches only rows 0 .. rows - 1 of a sequence.
// A sequence whose length lies outside 1 .. max_len, whose prefix is negative, or one of whose
// first length entries names a source or destination row outside the cache is skipped whole
// (left unchanged); every thread of the sequence reaches the same verdict from the same data.
extern "C" __global__ void compact_kv(
    WORD_T* __restrict__ kv, long long layer_stride, long long batch_stride, long long row_stride,
    long long rows, int row_words, const PLEN_T* __restrict__ prefix_lens, const int* __restrict__ indices,
    const int* __restrict__ length, int max_len) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= row_words) return;
    const long long prefix = (long long)prefix_lens[b];
    const int len = length[b];
    if (len < 1 || len > max_len || len > MAX_ACCEPT || prefix < 0) return;
    const int* idx = indices + (long long)b * max_len;
    for (int i = 0; i < len; ++i)
        if (idx[i] < 0 || prefix + idx[i] >= rows || prefix + i >= rows) return;
    WORD_T* base = kv + blockIdx.z * layer_stride + b * batch_stride + prefix * row_stride + c;
    WORD_T vals[MAX_ACCEPT];
#pragma unroll
    for (int i = 0; i < MAX_ACCEPT; ++i)
        if (i < len && idx[i] != i) vals[i] = base[(long long)idx[i] * row_stride];
#pragma unroll
    for (int i = 0; i < MAX_ACCEPT; ++i)
        if (i < len && idx[i] != i) base[(long long)i * row_stride] = vals[i];
}
