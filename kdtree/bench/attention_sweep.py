"""Verify-attention sweep for the workbook: every variant, both L2 states, eager and graph.

For each (q_len, prefix, batch, heads) point: build input sets sharing one random tree (the
benchmark's ``make_sets``), check each variant against the float64 reference on them
(``attention_bench.check``; a variant that fails is not timed), then time it. On a GPU: warm L2
(one input set, reused) and cold L2 (input sets rotating over more than 2.5x the L2, flushed
before each eager call), each as eager launches and as CUDA-graph replay. On a CPU: host time of
the variants that run there. Variants come from ``kdtree.attention.VARIANTS`` and the
benchmark's ``VARIANTS`` at run time, so a new one shows up without edits here.
"""
from __future__ import annotations

import itertools
import math

import pandas as pd
import torch
from tqdm import tqdm

from kdtree import attention
from kdtree.bench import attention_bench
from kdtree.bench.attention_bench import SCALE, check, make_sets
from kdtree.bench.ceilings import Ceilings
from kdtree.bench.models import verify_attention_cost
from kdtree.bench.roofline import roof_times
from kdtree.bench.timing import Timing, time_events, time_graph, time_host

SKIP_MS = 40.0   # a variant whose roofline floor is above this per call is not timed at that point


def runnable_variants(device: torch.device, wanted=None) -> list[str]:
    """The variants (or ``wanted`` of them) that run on ``device``.

    The names are those of ``kdtree.attention.VARIANTS`` plus the benchmark's own
    (``attention_bench.VARIANTS``, e.g. ``fused_mma``); off a GPU only the library's variants
    outside ``kdtree.attention.CUDA_VARIANTS`` run.
    """
    library = tuple(getattr(attention, "VARIANTS", ("torch",)))
    known = library + tuple(v for v in getattr(attention_bench, "VARIANTS", ()) if v not in library)
    wanted = list(known if not wanted else wanted)
    unknown = [v for v in wanted if v not in known]
    if unknown:
        raise ValueError(f"variants: {unknown} not among the known variants {known}")
    cpu = set(library) - set(getattr(attention, "CUDA_VARIANTS", ()))
    return [v for v in wanted if device.type == "cuda" or v in cpu]


def _timings(fns, device: torch.device, quick: bool) -> list[Timing]:
    """Warm and cold, eager and graph on a GPU; host time on a CPU."""
    if device.type != "cuda":
        return [time_host(fns[0], reps=3 if quick else 10, warmup=1)]
    t0 = time_events(fns[:1], reps=3, warmup=1).median_us
    reps = int(min(30 if quick else 200, max(5, 0.2e6 / t0)))
    per_graph = max(1, min(8, int(2e3 / t0)))
    g_reps = int(min(10 if quick else 50, max(3, 0.2e6 / (t0 * per_graph))))
    it = itertools.count()

    def rotating():
        return fns[next(it) % len(fns)]()

    return [time_events(fns[:1], reps=reps, warmup=2, l2="warm"),
            time_graph(fns[0], reps=g_reps, calls_per_graph=per_graph, warmup=1, l2="warm"),
            time_events(fns, reps=reps, warmup=2, l2="cold"),
            _cold(time_graph(rotating, reps=g_reps, calls_per_graph=len(fns) * per_graph, warmup=1))]


def _call(variant, q, kv, pl, tree):
    """One call of ``variant``: through the benchmark's ``call`` (which knows its extra variants)
    when it has one, else ``verify_attention`` without value checks."""
    call = getattr(attention_bench, "call", None)
    if call is not None:
        return call(variant, q, kv, pl, tree)
    return attention.verify_attention(q, kv, pl, tree, SCALE, variant, check_values=False)


def _cold(t: Timing) -> Timing:
    """Label a graph timing over rotating inputs larger than the L2 as cold."""
    return Timing(t.median_us, t.p20_us, t.p80_us, t.reps, t.mode, "cold")


def run_attention_sweep(q_lens, prefixes, batches, heads, variants=None, *, ceilings: Ceilings | None = None,
                        quick: bool = False, progress: bool = True, seed: int = 0) -> pd.DataFrame:
    """Check and time every runnable variant over the product of the given sizes.

    Parameters
    ----------
    q_lens, prefixes, batches, heads : sequences of int
        N (= budget + 1), P, B and H (heads on this GPU: 64 / tensor-parallel shards).
    variants : sequence of str, optional
        Subset of ``kdtree.attention.VARIANTS``; default all that run on this device.
    ceilings : Ceilings, optional
        Used to skip points whose roofline floor exceeds ``SKIP_MS`` (the naive variant at
        large shapes); without it nothing is skipped.
    quick : bool
        Fewer repetitions.

    Returns
    -------
    DataFrame
        Tidy rows: kernel, variant, q_len, prefix, batch, heads, tree_visible, sets, mode, l2,
        median_us, p20_us, p80_us, reps, check_rel, check_lse.
    """
    for name, values in (("q_lens", q_lens), ("prefixes", prefixes), ("batches", batches), ("heads", heads)):
        if not values or any(int(v) != v or v < (0 if name == "prefixes" else 1) for v in values):
            raise ValueError(f"{name}: expected a non-empty list of integers, got {values!r}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = runnable_variants(device, variants)
    gen = torch.Generator().manual_seed(seed)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size if device.type == "cuda" else 0
    rows, notes = [], []
    grid = list(itertools.product(q_lens, prefixes, batches, heads))
    for N, P, B, H in tqdm(grid, desc="verify attention", disable=not progress):
        set_bytes = B * N * H * attention.D_QK * 2 + B * (P + N) * attention.D_QK * 2
        n_sets = max(1, min(24, math.ceil(2.5 * l2_bytes / set_bytes))) if l2_bytes else 1
        tree, pl, sets = make_sets(B, N, H, P, n_sets, device, gen)
        real = tree.depth[tree.depth >= 0]
        tree_visible = float((real + 1).float().mean())
        for v in names:
            if ceilings is not None and ceilings.kind == "gpu":
                cost = verify_attention_cost(v, batch=B, nodes=N, heads=H, prefix=P, tree_visible=tree_visible)
                floor_ms = max(roof_times(cost, ceilings, "graph", "cold").values()) / 1e3
                if floor_ms > SKIP_MS:
                    notes.append(f"{v} N={N} P={P} B={B} H={H}: not timed (roofline floor {floor_ms:.0f} ms)")
                    continue
            try:
                rel, lse_err = check(v, *sets[0], pl, tree)
            except AssertionError as exc:
                notes.append(f"{v} N={N} P={P} B={B} H={H}: FAILED the check, not timed: {exc}")
                continue
            fns = [lambda s=s, v=v: _call(v, s[0], s[1], pl, tree) for s in sets]
            for t in _timings(fns, device, quick):
                rows.append({"kernel": "verify_attention", "variant": v, "q_len": N, "prefix": P, "batch": B,
                             "heads": H, "tree_visible": tree_visible, "sets": n_sets, **t.as_dict(),
                             "check_rel": rel, "check_lse": lse_err})
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for line in notes:
        print(line)
    return pd.DataFrame(rows)
