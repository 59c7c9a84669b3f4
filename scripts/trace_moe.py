"""Where the MoE layer's time goes, block by block (GPU host).

Builds the layer's kernels with ``-DMOE_TRACE`` (``cuda/moe_trace.cuh``: thread 0 of every block
records its start, the return of its wait for the kernel before, and its end, in globaltimer
nanoseconds, plus its SM), times the kimi_k2_ep8 bf16 layer (its own router) by CUDA-graph
replay with the plain and the traced build, then replays a graph of three layer calls once
with the records zeroed and reads back the last call's records: the steady state (each kernel
follows the one before it in the stream, under programmatic dependent launch). ``HANDOFF=1``
builds two banks instead (``MOE_TRACE_BANKS``) and reads the first two calls, to see the second
call's router follow the first call's combine; the bank look-up delays every block's start, so
that timeline runs slower than the plain layer (the script prints both times).

Prints per T a table of each launch's blocks (the gate/up and down GEMMs split into the
shared expert's rows, the routed rows and the empty blocks, which exit at once): start,
wait returned and end, earliest / median / latest, in microseconds from the router's first
wait returning, and the blocks' median busy time, then the router finaliser's steps and the
hand-off from the first call's combine (``HANDOFF=1``). The input x of each T is the first of a
seeded series whose own routing touches ``expected_distinct`` local experts (rounded, at least
one). Saves the raw records in OUT (``trace_moe_T<T>.npz``: one array per launch, and with
``HANDOFF=1`` the first call's under ``prev_<launch>``).

    PYTHONPATH=. python scripts/trace_moe.py OUT [T ...]
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import torch

from kdtree import experts as ek
from kdtree import kernels
from kdtree.bench.moe import expected_distinct, moe_layer
from kdtree.bench.timing import time_graph
from kdtree.engine.config import get_config

WORDS = 10         # MOE_TRACE_WORDS
BANKS = 2 if os.environ.get("HANDOFF") == "1" else 1   # MOE_TRACE_BANKS
SLOTS = 16384      # MOE_TRACE_SLOTS
TRACE = (("MOE_TRACE", 1),) + ((("MOE_TRACE_BANKS", BANKS),) if BANKS > 1 else ())
_plain = ek._kernel
_used: list[tuple[str, str, tuple]] = []   # (src, kernel, defines) of every traced look-up


def typical_input(moe, T: int) -> tuple[torch.Tensor, int]:
    """The first x [T, dim] of a seeded series whose routing by ``moe`` touches the typical number
    of its local experts (``expected_distinct``, rounded, at least one), and that number."""
    El = moe.w1.shape[0]
    want = max(1, round(expected_distinct(T, moe.k, moe.n_routed, El)))
    for seed in range(1000):
        x = torch.randn(T, moe.w1.shape[2], generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16)
        e = moe.route(x)[1]
        if int(e[e < El].unique().numel()) == want:
            return x, want
    raise RuntimeError(f"no input among 1000 seeds touches {want} local experts at T = {T}")


def use_trace(on: bool) -> None:
    """Route the layer's kernel look-ups to the traced builds (on) or back to the package's."""
    def lookup(name, index, defines, src=ek._SRC):
        d = tuple(defines) + TRACE
        if (src, name, d) not in _used:
            _used.append((src, name, d))
        return _plain(name, index, d, src)

    ek._kernel = lookup if on else _plain


def module(src: str, defines: tuple):
    """The cached module a traced look-up loaded (``kernels.get_kernel``'s NVRTC path)."""
    major, minor = torch.cuda.get_device_capability()
    key = hashlib.sha256(kernels.read_source(src).encode()).hexdigest()
    return kernels._module(src, kernels.define_options(dict(defines)), "nvrtc", f"sm_{major}{minor}", key)


def buffer(src: str, defines: tuple):
    import cupy

    ptr = module(src, defines).get_global("moe_trace")
    return cupy.ndarray((BANKS, SLOTS, WORDS), dtype=cupy.uint64, memptr=ptr)


def launches() -> list[tuple[str, str, tuple]]:
    """The traced (src, kernel, defines) in launch order, one entry per distinct module."""
    seen, out = set(), []
    for src, name, d in _used:
        if (src, d) not in seen:
            seen.add((src, d))
            out.append((src, name, d))
    return out


def label(name: str, defines: tuple) -> str:
    d = dict(defines)
    if name == "moe_grouped_gemm":
        return "gate_up" if d.get("MOE_GATED") == 1 else "down"
    return name.removeprefix("moe_")


def summarize(recs: dict[str, np.ndarray], chunks: dict[str, int]) -> list[dict]:
    t0 = recs["router_mma"][:, 1].min()
    rows = []
    for name, r in recs.items():
        groups = [(name, r)]
        if name in chunks:   # empty blocks (no expert for their grid row) exit within a few hundred ns
            y = (r[:, 5] >> 16).astype(np.int64)
            full = (r[:, 2] - r[:, 0]) > 500
            groups = [(name + " shared", r[full & (y < chunks[name])]), (name + " routed", r[full & (y >= chunks[name])]),
                      (name + " empty", r[~full])]
        for g, rr in groups:
            busy = (rr[:, 2] - rr[:, 0]).astype(np.float64) / 1e3
            if not len(rr):
                continue
            rel = (rr[:, :3].astype(np.int64) - int(t0)) / 1e3
            row = {"launch": g, "blocks": len(rr), "SMs": len(np.unique(rr[:, 5] & 0xFFFF))}
            for i, what in enumerate(("start", "waited", "end")):
                row |= {f"{what} min": rel[:, i].min(), f"{what} med": np.median(rel[:, i]),
                        f"{what} max": rel[:, i].max()}
            row["busy med"] = float(np.median(busy))
            row["busy kclk med"] = float(np.median((rr[:, 4] - rr[:, 3]).astype(np.float64))) / 1e3
            rows.append(row)
    return rows


def _from_router(router: np.ndarray):
    """ns -> us from the router's first wait returning (the tables' origin)."""
    t0 = int(router[:, 1].min())
    return lambda v: (int(v) - t0) / 1e3


def finaliser_steps(r: np.ndarray) -> str:
    """The router's tail: its last ticket, then its (first) finaliser's marks and end, in us."""
    us = _from_router(r)
    fin = r[r[:, 7] > 0]
    if not len(fin):
        return "router: no finaliser marks"
    f = fin[np.argmin(fin[:, 7])]
    return (f"router tail: last ticket {us(r[:, 6].max()):.2f}, every ticket seen {us(f[7]):.2f}, "
            f"scores summed {us(f[8]):.2f}, top k written {us(f[9]):.2f}, finaliser ends {us(f[2]):.2f} us")


def handoff(prev_combine: np.ndarray, router: np.ndarray) -> str:
    """From the previous call's combine to this call's router, in us from the router's first wait."""
    us = _from_router(router)
    return (f"hand-off: the previous call's combine waited {us(prev_combine[:, 1].min()):.2f} and ended "
            f"{us(prev_combine[:, 2].max()):.2f}; this call's router blocks started {us(router[:, 0].min()):.2f} "
            f"to {us(router[:, 0].max()):.2f}, their wait returned at 0")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    Ts = [int(t) for t in sys.argv[2:]] or [1, 4]
    import pandas as pd

    pd.set_option("display.width", 250)
    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16)
    for T in Ts:
        x, want = typical_input(moe, T)
        ref = moe(x).float()
        times = {}
        for on in (False, True, False, True):
            use_trace(on)
            got = moe(x).float()
            if not torch.equal(got, ref):   # the records must not change the result
                raise AssertionError(f"T={T}: the traced layer's output differs from the plain one")
            times.setdefault("traced" if on else "plain", []).append(time_graph(lambda x=x: moe(x), reps=20).median_us)
        use_trace(True)
        calls = 3
        graph = torch.cuda.CUDAGraph()
        moe(x)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                moe(x)
        graph.replay()
        torch.cuda.synchronize()
        for src, _, d in launches():
            buffer(src, d).fill(0)
        graph.replay()
        torch.cuda.synchronize()
        recs, prev, chunks = {}, {}, {}
        for src, name, d in launches():   # one bank: the last call; two: the graph's first and second
            r = buffer(src, d).get()
            recs[label(name, d)] = r[-1][r[-1][:, 0] > 0]
            if BANKS > 1:
                prev[label(name, d)] = r[0][r[0][:, 0] > 0]
        gate_up, down = ek.layer_gemm_options(T, moe.k, moe.n_routed, moe.w1.shape[0], moe.w1.shape[2])
        for g, opts in (("gate_up", gate_up), ("down", down)):
            chunks[g] = -(-T // (8 * opts["nt"]))
        np.savez(out / f"trace_moe_T{T}.npz", **recs, **{f"prev_{k}": v for k, v in prev.items()},
                 **{f"chunks_{k}": np.array(v) for k, v in chunks.items()})
        use_trace(False)
        print(f"\nT = {T}, {want} local experts touched: layer {'/'.join(f'{v:.1f}' for v in times['plain'])} us plain, "
              f"{'/'.join(f'{v:.1f}' for v in times['traced'])} us traced (graph replay, medians); "
              f"times in us from the router's first wait returning")
        print(pd.DataFrame(summarize(recs, chunks)).round(2).to_string(index=False))
        print(finaliser_steps(recs["router_mma"]), flush=True)
        if BANKS > 1:
            print(handoff(prev["combine"], recs["router_mma"]), flush=True)


if __name__ == "__main__":
    main()
