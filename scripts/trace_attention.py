"""Where a warp-specialised verify kernel's time goes, tile by tile (GPU host, sm_90a).

Builds ``cuda/verify_attention_tma.cu`` (impl ``tma`` / ``tma_seq``: the first 8 blocks record
clock64 at every handoff of the consumer warpgroups, the producer and a watcher on the full
barriers), ``cuda/verify_attention_pair.cu`` (impl ``pair``: thread 0 of each warpgroup at its
handoffs, loads issued, and when S saw a tile's first and last box landed) or
``cuda/verify_attention_rows_n72.cu`` (impl ``rn72``: thread 0 of each warpgroup at its handoffs,
the loads it issues, and the tiles that moved a row's shift) with ``-DATT_TRACE
(``cuda/attention_trace.cuh``), checks the traced kernel against float64, times it and the
untraced kernel by CUDA-graph replay (what the trace costs), then runs it once after an L2 flush
and reads the records back. Prints, per shape, the median of each interval over the blocks'
steady-state tiles (first and last two left out) and one block's timeline around its middle tile;
saves the raw records (``trace_<impl>_<B>_<N>_<H>_<P>.npz``) in OUT.

    PYTHONPATH=. python scripts/trace_attention.py OUT [IMPL] [B,N,H,P ...]

``rn72`` runs only fused calls in the rows_n layout, so it is called directly (not through
``KDTREE_FUSED_IMPL``) with the split count ``launch_plan`` gives it, or ``SPLITS=n``.

The flush before the traced call reads a buffer twice the L2 (``kdtree.bench.timing.L2Flush``, as
the timings do); ``FLUSH=write`` zeroes 256 MB instead, as this script did up to 0f12ac9's traces,
which leaves the L2 full of dirty lines for the traced call to write back; ``FLUSH=none`` traces a
call whose data and code the timed replays left in the L2.
``DEFINES="TMA_ISSUERS=9,..."`` builds both kernels with those defines as well (a variant under
trial); ``TRACE=0`` only checks and times the plain build.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import torch

from kdtree import attention, kernels
from kdtree.bench.attention_sweep import SCALE, check, make_sets
from kdtree.bench.timing import L2Flush, time_graph

EV = ["start", "full_wait", "s_issued", "s_done", "free_wait", "pub", "pub_wait", "pv_issued", "pv_done",
      "empty", "end", "empty_wait", "tma_issued", "landed", "masked", "entry", "epi_sync", "o_stored", "rescaled"]
ROLES = ["wg0", "wg1", "producer", "watcher"]
BLOCKS, N_REC = 8, 2048   # ATT_TRACE_BLOCKS, ATT_TRACE_N in cuda/attention_trace.cuh
EXTRA = dict(kv.split("=", 1) for kv in os.environ.get("DEFINES", "").split(",") if kv)
TRACE = {"ATT_TRACE": 1, **EXTRA}
FLUSH = os.environ.get("FLUSH", "read")
if FLUSH not in ("read", "write", "none"):
    raise SystemExit(f"FLUSH={FLUSH!r}: expected 'read', 'write' or 'none'")


def source(impl: str) -> str:
    """The source file (``cuda/<name>.cu``) of a traced kernel."""
    return {"pair": attention._SRC_PAIR, "rn72": attention._SRC_RN72}.get(impl, attention._SRC_TMA)


def traced_module(impl: str):
    """The traced module of ``impl``: the same cached instance whose kernels the patched launch runs."""
    src = source(impl)
    key = hashlib.sha256(kernels.read_source(src).encode()).hexdigest()
    return kernels._module(src, kernels.define_options(TRACE), "nvcc", "sm_90a", key)


def use_trace(on: bool, impl: str) -> None:
    """Route the kernel look-up of ``impl``'s source to the traced build (on) or back to the package's."""
    if not hasattr(attention, "_kernel_untraced"):
        attention._kernel_untraced = attention._kernel

    def lookup(name, index, src=attention._SRC, compiler="nvrtc", defines=TRACE if on else EXTRA):
        if src == source(impl) and defines:
            return kernels.get_kernel(src, name, defines, device=index, compiler=compiler)
        return attention._kernel_untraced(name, index, src, compiler)

    attention._kernel = lookup


def read_records(mod) -> np.ndarray:
    """The traced module's raw records: [block][role][record][clock, event << 32 | tile]."""
    import cupy

    ptr = mod.get_global("att_trace")
    return cupy.ndarray((BLOCKS, len(ROLES), N_REC, 2), dtype=cupy.uint64, memptr=ptr).get()


def parse_records(raw: np.ndarray) -> list[dict[str, list[tuple[int, str, int]]]]:
    """Per traced block, per role, its records as (clock, event name, tile) in recording order."""
    blocks = []
    for b in range(raw.shape[0]):
        roles = {}
        for r, name in enumerate(ROLES):
            roles[name] = [(int(c), EV[int(m >> 32)], int(np.int32(np.uint32(m & 0xFFFFFFFF))))
                           for c, m in raw[b, r] if c != 0]
        blocks.append(roles)
    return blocks


def summary(blocks: list[dict], mhz: float, impl: str) -> dict[str, np.ndarray]:
    """Every interval of :func:`intervals` (:func:`pair_intervals` for ``pair``,
    :func:`rn72_intervals` for ``rn72``) over the steady-state tiles of all traced blocks (us)."""
    merged: dict[str, list[float]] = {}
    of = {"pair": pair_intervals, "rn72": rn72_intervals}.get(impl, intervals)
    for roles in blocks:
        for k, v in of(roles, mhz).items():
            merged.setdefault(k, []).extend(v)
    return {k: np.array(v) for k, v in merged.items()}


def handoffs(roles: dict) -> dict[tuple[str, str, int], int]:
    """{(role, event, tile): clock} of a block's records, the first record of each."""
    at = {}
    for role, recs in roles.items():
        for c, ev, t in recs:
            at.setdefault((role, ev, t), c)
    return at


def intervals(roles: dict, mhz: float) -> dict[str, list[float]]:
    """Per steady-state tile, the intervals (us) between the handoffs of one block."""
    at = handoffs(roles)
    n = 1 + max((t for (r, ev, t) in at if ev == "tma_issued"), default=-1)
    us = lambda a, b: (b - a) / mhz
    out: dict[str, list[float]] = {}

    def put(name, a, b):
        if a is not None and b is not None:
            out.setdefault(name, []).append(us(a, b))

    for i in range(2, n - 2):
        own, oth = f"wg{i & 1}", f"wg{1 - (i & 1)}"
        g = lambda role, ev, t=i: at.get((role, ev, t))
        put("load: tma issued -> landed", g("producer", "tma_issued"), g("watcher", "landed"))
        put("stage wait: both released tile i-2 -> producer sees it",
            max(filter(None, [g("wg0", "empty", i - 2), g("wg1", "empty", i - 2)]), default=None),
            g("producer", "empty_wait"))
        put("owner: S(i) issued -> S(i) done", g(own, "s_issued"), g(own, "s_done"))
        put("owner: landed -> S(i) issued", g("watcher", "landed"), g(own, "s_issued"))
        put("owner: S done -> masked (scale, mask, row max)", g(own, "s_done"), g(own, "masked"))
        put("owner: masked -> free wait done", g(own, "masked"), g(own, "free_wait"))
        put("owner: free wait -> pub (softmax)", g(own, "free_wait"), g(own, "pub"))
        put("owner: pub -> own pub wait done", g(own, "pub"), g(own, "pub_wait"))
        put("owner: own pub wait -> P V(i) issued (rescale O, issue)", g(own, "pub_wait"), g(own, "pv_issued"))
        put("owner: P V(i) issued -> done", g(own, "pv_issued"), g(own, "pv_done"))
        put("other: P V(i-1) done -> S(i+1) issued (incl. full wait)", g(oth, "empty", i - 1), g(oth, "s_issued", i + 1))
        put("other: S(i+1) issued -> pub(i) seen", g(oth, "s_issued", i + 1), g(oth, "pub_wait"))
        put("other: P V(i) issued -> done (with S(i+1))", g(oth, "pv_issued"), g(oth, "pv_done"))
        put("tile period (landed i -> landed i+1)", g("watcher", "landed"), g("watcher", "landed", i + 1))
    return out


def pair_intervals(roles: dict, mhz: float) -> dict[str, list[float]]:
    """Per steady-state pair of tiles (A = a, B = a + 1) of the pair kernel, the intervals (us)
    between the handoffs of one block (wg0 computes S_A, wg1 S_B; each does both P V)."""
    at = handoffs(roles)
    n = 1 + max((t for (r, ev, t) in at if ev == "s_done"), default=-1)
    out: dict[str, list[float]] = {}

    def put(name, a, b):
        if a is not None and b is not None:
            out.setdefault(name, []).append((b - a) / mhz)

    for a in range(2, n - 4, 2):
        def g(role, ev, t):
            return at.get((role, ev, t))
        for name, x, y in [
            ("wg0: S_A first box seen -> last box seen", ("wg0", "full_wait", a), ("wg0", "landed", a)),
            ("wg0: S_A issued (boxes waited) -> done", ("wg0", "s_issued", a), ("wg0", "s_done", a)),
            ("wg0: S_A done -> masked", ("wg0", "s_done", a), ("wg0", "masked", a)),
            ("wg0: masked -> SCALE0 (softmax)", ("wg0", "masked", a), ("wg0", "pub", a)),
            ("wg0: SCALE0 -> P_A V issued", ("wg0", "pub", a), ("wg0", "pv_issued", a)),
            ("wg0: P_A V issued -> done", ("wg0", "pv_issued", a), ("wg0", "pv_done", a)),
            ("wg0: P_A V done -> SCALE1 seen", ("wg0", "pv_done", a), ("wg0", "pub_wait", a + 1)),
            ("wg0: SCALE1 seen -> P1 seen (P_A stored)", ("wg0", "pub_wait", a + 1), ("wg0", "free_wait", a + 1)),
            ("wg0: P1 seen -> P_B V issued", ("wg0", "free_wait", a + 1), ("wg0", "pv_issued", a + 1)),
            ("wg0: P_B V issued -> done", ("wg0", "pv_issued", a + 1), ("wg0", "pv_done", a + 1)),
            ("wg0: P_B V issued -> next S_A issued", ("wg0", "pv_issued", a + 1), ("wg0", "s_issued", a + 2)),
            ("wg0: next A boxes 0-3 loaded -> first seen", ("wg0", "tma_issued", a + 2), ("wg0", "full_wait", a + 2)),
            ("wg1: next A boxes 4-8 loaded -> last seen (wg0)", ("wg1", "tma_issued", a + 2), ("wg0", "landed", a + 2)),
            ("wg1: S_B done -> SCALE0 seen", ("wg1", "s_done", a + 1), ("wg1", "pub_wait", a)),
            ("wg1: SCALE0 seen -> masked", ("wg1", "pub_wait", a), ("wg1", "masked", a + 1)),
            ("wg1: masked -> SCALE1 (softmax)", ("wg1", "masked", a + 1), ("wg1", "pub", a + 1)),
            ("wg1: SCALE1 -> P_B V issued (P_B stored)", ("wg1", "pub", a + 1), ("wg1", "pv_issued", a + 1)),
            ("wg1: P_B V issued -> P0 seen", ("wg1", "pv_issued", a + 1), ("wg1", "free_wait", a)),
            ("wg1: P0 seen -> P_A V issued", ("wg1", "free_wait", a), ("wg1", "pv_issued", a)),
            ("wg1: P_B V issued -> done", ("wg1", "pv_issued", a + 1), ("wg1", "pv_done", a + 1)),
            ("wg1: P_A V issued -> done", ("wg1", "pv_issued", a), ("wg1", "pv_done", a)),
            ("wg1: next B boxes 4-8 loaded -> first seen", ("wg1", "tma_issued", a + 3), ("wg1", "full_wait", a + 3)),
            ("wg0: next B boxes 0-3 loaded -> last seen (wg1)", ("wg0", "tma_issued", a + 3), ("wg1", "landed", a + 3)),
            ("wg1: next S_B first box seen -> last box seen", ("wg1", "full_wait", a + 3), ("wg1", "landed", a + 3)),
            ("wg1: next S_B issued -> done", ("wg1", "s_issued", a + 3), ("wg1", "s_done", a + 3)),
            ("pair period (S_A done -> next S_A done)", ("wg0", "s_done", a), ("wg0", "s_done", a + 2)),
        ]:
            put(name, g(*x), g(*y))
    return out


def rn72_intervals(roles: dict, mhz: float) -> dict[str, list[float]]:
    """Per steady-state tile of the rn72 kernel, the intervals (us) between the handoffs of one
    block (wg0: S^T, the softmax, P and O^T value blocks 0-1; wg1: value blocks 2-7), and
    ``rescaled``: 1 for a tile that moved some row's shift (the full max step), else 0."""
    at = handoffs(roles)
    n = 1 + max((t for (r, ev, t) in at if ev == "pv_done"), default=-1)
    out: dict[str, list[float]] = {}
    for i in range(2, n - 2):
        def g(role, ev, t=i):
            return at.get((role, ev, t))
        for name, x, y in [
            ("wg0: O^T(i-1) done -> value boxes of i seen", g("wg0", "pv_done", i - 1), g("wg0", "full_wait")),
            ("wg0: value boxes seen -> rope box seen", g("wg0", "full_wait"), g("wg0", "landed")),
            ("wg0: rope box seen -> S^T issued (36 wgmma)", g("wg0", "landed"), g("wg0", "s_issued")),
            ("wg0: S^T issued -> done", g("wg0", "s_issued"), g("wg0", "s_done")),
            ("wg0: S^T done -> wg1 done with P(i-1)", g("wg0", "s_done"), g("wg0", "free_wait")),
            ("wg0: P free -> masked (scale, mask, max step if any)", g("wg0", "free_wait"), g("wg0", "masked")),
            ("wg0: masked -> P published (exp, P stores)", g("wg0", "masked"), g("wg0", "pub")),
            ("wg0: P published -> O^T 0-1 done", g("wg0", "pub"), g("wg0", "pv_done")),
            ("wg0: boxes 0-1 of i issued -> seen", g("wg0", "tma_issued"), g("wg0", "full_wait")),
            ("wg1: boxes 2-7 of i issued -> seen (wg0)", g("wg1", "tma_issued"), g("wg0", "full_wait")),
            ("wg1: P(i) published -> seen", g("wg0", "pub"), g("wg1", "pub_wait")),
            ("wg1: P seen -> O^T 2-7 issued (rescale, issue)", g("wg1", "pub_wait"), g("wg1", "pv_issued")),
            ("wg1: O^T 2-7 issued -> done", g("wg1", "pv_issued"), g("wg1", "pv_done")),
            ("wg1: O^T(i) done -> P(i+1) seen (idle)", g("wg1", "pv_done"), g("wg1", "pub_wait", i + 1)),
            ("tile period (S^T issued i -> i+1)", g("wg0", "s_issued"), g("wg0", "s_issued", i + 1)),
        ]:
            if x is not None and y is not None:
                out.setdefault(name, []).append((y - x) / mhz)
        out.setdefault("rescaled", []).append(float(g("wg0", "rescaled") is not None))
    return out


# Events whose tile field is not a tile: the globaltimer stamps (ns, low 32 bits) and the end.
NOT_A_TILE = ("start", "entry", "end")


def timeline(roles: dict, mhz: float) -> list[str]:
    """One block's records around its middle tile (tiles mid - 1 .. mid + 1), in clock order, us
    from the block's first record: a heading line, then one line a record. The block's tiles are
    those with a P V done (the pair kernel's last wait on S carries the tile number past the end)."""
    t0 = min(c for recs in roles.values() for c, _, _ in recs)
    n = 1 + max((t for recs in roles.values() for _, ev, t in recs if ev == "pv_done"), default=0)
    mid = n // 2
    evs = sorted((c, r, ev, t) for r, recs in roles.items() for c, ev, t in recs
                 if ev not in NOT_A_TILE and mid - 1 <= t <= mid + 1)
    return [f"  block 0, tiles {mid - 1}..{mid + 1} of {n} (us from the block's first record):"] + [
        f"    {(c - t0) / mhz:9.3f}  {r:8s} {ev:11s} tile {t}" for c, r, ev, t in evs]


def main(out_dir: str, impl: str = "tma", *shapes: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if impl != "rn72":
        os.environ["KDTREE_FUSED_IMPL"] = impl
        attention.fused_impl.cache_clear()
    splits = int(os.environ["SPLITS"]) if os.environ.get("SPLITS") else None
    shapes = shapes or ("1,257,64,4096", "16,33,64,16384", "64,9,8,16384")
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    for text in shapes:
        B, N, H, P = (int(x) for x in text.split(","))
        tree, pl, sets = make_sets(B, N, H, P, 1, dev, gen)
        q, kv = sets[0]
        plan = attention.launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=kv.shape[1],
                                     num_sms=attention._num_sms(0), impl=impl, splits=splits)
        result = (torch.empty(B, N, H, attention.D_V, dtype=torch.bfloat16, device=dev),
                  torch.empty(B, N, H, dtype=torch.float32, device=dev))

        def run(q=q, kv=kv, pl=pl, tree=tree, result=result):
            if impl != "rn72":
                return attention.verify_attention(q, kv, pl, tree, SCALE, "fused", check_values=False)
            attention._run_cuda("fused", q, kv, pl, tree, SCALE, *result, splits=splits, impl=impl, layout="rows_n")
            return result

        res = {}
        for on in (False, True)[:1 + (os.environ.get("TRACE", "1") != "0")]:
            use_trace(on, impl)
            rel, _ = check("fused", q, kv, pl, tree, run())
            t = time_graph(run, reps=10, calls_per_graph=1, warmup=2, l2="cold")
            res[on] = t
            print(f"{impl} {EXTRA or ''} B={B} N={N} H={H} P={P} splits={plan.splits} {'traced' if on else 'plain '}: "
                  f"{t.median_us:8.1f} us [{t.p20_us:.1f}, {t.p80_us:.1f}] at {t.sm_clock_mhz:.0f} MHz, rel err {rel:.1e}")
        if True not in res:
            continue
        mod = traced_module(impl)
        import cupy
        cupy.cuda.runtime.memset(int(mod.get_global("att_trace").ptr), 0, BLOCKS * len(ROLES) * N_REC * 16)
        if FLUSH == "write":  # what this script did before: the L2 left full of dirty lines
            torch.empty(256 << 20, dtype=torch.uint8, device=dev).zero_()
        elif FLUSH == "read":  # the benchmarks' flush: read, so the traced call writes back nothing of the flush's
            L2Flush(dev)()
        run()
        torch.cuda.synchronize()
        use_trace(False, impl)
        raw = read_records(mod)
        np.savez_compressed(out / f"trace_{impl}_{B}_{N}_{H}_{P}.npz", raw=raw, mhz=res[True].sm_clock_mhz)
        mhz = res[True].sm_clock_mhz
        blocks = parse_records(raw)
        print(f"  steady-state tiles of {BLOCKS} blocks, median [p10, p90] us at {mhz:.0f} MHz:")
        for k, a in summary(blocks, mhz, impl).items():
            print(f"    {k:58s} {np.median(a):7.3f} [{np.percentile(a, 10):.3f}, {np.percentile(a, 90):.3f}]  n={a.size}")
        for line in timeline(blocks[0], mhz):
            print(line)


if __name__ == "__main__":
    main(*sys.argv[1:])
