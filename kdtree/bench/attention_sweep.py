"""The verify-attention benchmark: every variant checked, then timed in both L2 states, eager and graph.

For each (q_len, prefix, batch, heads) point: build input sets sharing one random tree
(``make_sets``), check each variant against the float64 reference on them (``check``; a variant
that fails is not timed), then time it. On a GPU: warm L2 (one input set, reused) and cold L2
(input sets rotating over more than 2.5x the L2, flushed before each eager call), each as
eager launches and as CUDA-graph replay (the graphs of all the variants at a point replayed in
turn, so that they meet the same SM clock). On a CPU: host time of the variants that run there.
Variants come from ``kdtree.attention.VARIANTS`` plus this module's ``VARIANTS`` (``fused_mma``:
the fused variant forced onto the mma.sync kernel), so a new one shows up without edits here.

A variant is not timed at a point where the cost model (``kdtree.bench.models``) puts the
timing's total device time (its roofline floor times the calls it would make) above the
point's ``budget_s``. Every row records the launch plan the call followed (``splits``,
``layout``, ``impl``; ``kdtree.attention.launch_plan``).

    python -m kdtree.bench.attention_sweep --out results/verify_attention_h200
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math

import pandas as pd
import torch
from tqdm import tqdm

from kdtree import attention
from kdtree.attention import D_QK, D_V, errors, random_parents, reference_attention
from kdtree.bench.ceilings import Ceilings
from kdtree.bench.models import launch_plan_columns, verify_attention_cost
from kdtree.bench.roofline import roof_times
from kdtree.bench.timing import Rounds, Timing, time_events, time_graphs
from kdtree.tree import Tree

SCALE = 1 / math.sqrt(192)
VARIANTS = ("fused_mma",)   # benchmark-only variants beside kdtree.attention.VARIANTS
BUDGET_S = 20.0             # default device-time budget of one variant's timings at one point


def runnable_variants(device: torch.device, wanted=None) -> list[str]:
    """The variants (or ``wanted`` of them) that run on ``device``.

    The names are those of ``kdtree.attention.VARIANTS`` plus this module's ``VARIANTS``; off
    a GPU only the library's variants outside ``kdtree.attention.CUDA_VARIANTS`` run.
    """
    library = tuple(getattr(attention, "VARIANTS", ("torch",)))
    known = library + tuple(v for v in VARIANTS if v not in library)
    wanted = list(known if not wanted else wanted)
    unknown = [v for v in wanted if v not in known]
    if unknown:
        raise ValueError(f"variants: {unknown} not among the known variants {known}")
    cpu = set(library) - set(getattr(attention, "CUDA_VARIANTS", ()))
    return [v for v in wanted if device.type == "cuda" or v in cpu]


def make_sets(B, N, H, P, n_sets, device, gen):
    """Input sets sharing one random tree (DDTree-like random recursive trees, all N nodes real)."""
    parents = random_parents(B, N, torch.full((B,), N), gen)
    tree = Tree.from_parents(parents.to(device))
    pl = torch.full((B,), P, dtype=torch.int32, device=device)
    sets = [(torch.randn(B, N, H, D_QK, device=device).to(torch.bfloat16),
             torch.randn(B, P + N, D_QK, device=device).to(torch.bfloat16)) for _ in range(n_sets)]
    return tree, pl, sets


def call(variant, q, kv, pl, tree):
    """One call of a variant (``fused_mma``: fused on the mma.sync kernel); returns (out, lse)."""
    if variant != "fused_mma":
        return attention.verify_attention(q, kv, pl, tree, SCALE, variant, check_values=False)
    B, N, H, _ = q.shape
    out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device=q.device),
           torch.empty(B, N, H, dtype=torch.float32, device=q.device))
    attention._run_cuda("fused", q, kv, pl, tree, SCALE, *out, impl="mma")
    return out


def impl_of(variant: str, device: torch.device) -> str | None:
    """The fused kernel a variant runs on ``device``, as ``launch_plan``'s ``impl``: None for
    variants without one and where the plan picks it per launch (``attention.default_impl``)."""
    if variant == "fused_mma":
        return "mma"
    if variant in ("fused", "cascade") and device.type == "cuda":
        return attention.default_impl(device.index or 0)
    return None


def _slice_tree(tree, b):
    return Tree(tree.tokens[b:b + 1], tree.parents[b:b + 1], tree.depth[b:b + 1],
                tree.num_nodes[b:b + 1], tree.visibility[b:b + 1], tree.draft_depth)


def check(variant, q, kv, pl, tree, result=None) -> tuple[float, float]:
    """Worst (out rel error, lse abs error) over the first and last sequence vs float64, of a call
    of ``variant`` or of ``result``, the (out, lse) of a call made already (``variant`` names it)."""
    out, lse = call(variant, q, kv, pl, tree) if result is None else result
    worst = (0.0, 0.0)
    for b in sorted({0, q.shape[0] - 1}):
        ref = reference_attention(q[b:b + 1], kv[b:b + 1], pl[b:b + 1], _slice_tree(tree, b), SCALE)
        rel, le, same_inf = errors(out[b:b + 1], lse[b:b + 1], *ref)
        if not (rel <= 1e-2 and le <= 1e-3 and same_inf):
            raise AssertionError(f"{variant} wrong at b={b}: rel={rel:.3e} lse={le:.3e} inf_ok={same_inf}")
        worst = (max(worst[0], rel), max(worst[1], le))
    return worst


def _plan(quick: bool, t0_us: float) -> dict:
    """Repetitions of each timing from a first estimate ``t0_us`` of one call. Eager calls under
    0.5 ms (host dispatch, whose median moves most between runs) get 100 repetitions in quick
    sweeps too."""
    per_graph = max(1, min(8, int(2e3 / t0_us)))
    cap = (100 if t0_us < 500 else 30) if quick else 200
    span = 0.1e6 if quick else 0.2e6   # microseconds of calls a timing aims at
    return {"reps": int(min(cap, max(5, span / t0_us))), "per_graph": per_graph,
            "g_reps": int(min(10 if quick else 50, max(3, span / (t0_us * per_graph))))}


def predicted_seconds(floor_us: float, n_sets: int, quick: bool) -> float:
    """Device seconds the four GPU timings of one variant take when a call costs ``floor_us``:
    eager warm and cold (``reps`` calls each plus warm-up) and graph warm and cold (``g_reps``
    replays of ``per_graph`` calls, the cold one over every input set)."""
    p = _plan(quick, max(floor_us, 1.0))
    calls = 2 * (p["reps"] + 2) + (p["g_reps"] + 2) * p["per_graph"] * (1 + n_sets) + 5
    return calls * floor_us * 1e-6


def trivial_call(variant: str, device: torch.device, gen: torch.Generator):
    """``(call, launches)``: a call of ``variant`` at a trivial size (B=1, N=2, H=8, P=1) and the
    launches it makes (NaN for ``torch``: its launches grow with the batch, the floor is its B=1
    call); its eager time is the variant's host floor (``time_events(floor=...)``)."""
    tree, pl, sets = make_sets(1, 2, 8, 1, 1, device, gen)
    launches = math.nan
    if variant != "torch":
        launches = attention.launch_plan("fused" if variant.startswith("fused") else variant, batch=1, nodes=2,
                                         heads=8, kv_rows=3, num_sms=1, impl=impl_of(variant, device) or "mma").launches
    return (lambda: call(variant, *sets[0], pl, tree)), launches


def _eager_timings(fns, quick: bool, floor, rounds: Rounds) -> tuple[dict, list[Timing]]:
    """A variant's timing plan (``_plan`` from one timed call) and its eager timings, warm and
    cold (``floor``: the variant's trivial call, timed interleaved with the eager calls),
    registered with ``rounds`` and taken when it runs."""
    p = _plan(quick, time_events(fns[:1], reps=3, warmup=1).median_us)
    return p, [rounds.events(fns[:1], reps=p["reps"], warmup=2, l2="warm", floor=floor),
               rounds.events(fns, reps=p["reps"], warmup=2, l2="cold", floor=floor)]


def _graph_timings(jobs) -> list[tuple[Timing, Timing]]:
    """Warm and cold graph timings of the variants of one point, ``jobs`` a list of (input-set
    calls, plan), all of them replayed in turn (``timing.time_graphs``): compared one after the
    other on a power-capped GPU the variants compared SM clock states (docs/design.md). Warm: the
    first set, reused; cold: every set in turn inside the graph (inputs larger than the L2)."""
    if not jobs:
        return []
    graphs, reps, per_graph = [], [], []
    for fns, p in jobs:
        it = itertools.count()
        graphs += [fns[0], lambda fns=fns, it=it: fns[next(it) % len(fns)]()]
        reps += [p["g_reps"]] * 2
        per_graph += [p["per_graph"], len(fns) * p["per_graph"]]
    t = time_graphs(graphs, reps=reps, calls_per_graph=per_graph, warmup=1)
    return [(t[2 * i], dataclasses.replace(t[2 * i + 1], l2="cold")) for i in range(len(jobs))]


def run_attention_sweep(q_lens, prefixes, batches, heads, variants=None, *, ceilings: Ceilings | None = None,
                        quick: bool = False, progress: bool = True, seed: int = 0,
                        budget_s: float = BUDGET_S) -> pd.DataFrame:
    """Check and time every runnable variant over the product of the given sizes.

    Parameters
    ----------
    q_lens, prefixes, batches, heads : sequences of int
        N (= budget + 1), P, B and H (heads on this GPU: 64 / tensor-parallel shards).
    variants : sequence of str, optional
        Subset of the known variants (``runnable_variants``); default all that run here.
    ceilings : Ceilings, optional
        GPU ceilings: a variant whose modelled timing time (``predicted_seconds`` of its
        roofline floor) exceeds ``budget_s`` is not timed at that point (the naive variant at
        large shapes); without GPU ceilings nothing is skipped.
    quick : bool
        Fewer repetitions.
    budget_s : float
        Device seconds one variant's timings may take at one point.

    Returns
    -------
    DataFrame
        Tidy rows: kernel, variant, q_len, prefix, batch, heads, tree_visible, sets, splits,
        layout, impl, mode, l2, median_us, p20_us, p80_us, reps, sm_clock_mhz, mem_clock_mhz,
        check_rel, check_lse.
    """
    for name, values in (("q_lens", q_lens), ("prefixes", prefixes), ("batches", batches), ("heads", heads)):
        if not values or any(int(v) != v or v < (0 if name == "prefixes" else 1) for v in values):
            raise ValueError(f"{name}: expected a non-empty list of integers, got {values!r}")
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = runnable_variants(device, variants)
    gen = torch.Generator().manual_seed(seed)
    props = torch.cuda.get_device_properties(0) if device.type == "cuda" else None
    l2_bytes = props.L2_cache_size if props else 0
    sms = props.multi_processor_count if props else 132
    # The eager (on a CPU: host) timings of every point are taken together at the end, in rounds
    # spread over all of them (``Rounds``): their inputs stay allocated until then.
    rows, notes, rounds = [], [], Rounds()
    grid = list(itertools.product(q_lens, prefixes, batches, heads))
    for N, P, B, H in tqdm(grid, desc="verify attention", disable=not progress):
        set_bytes = B * N * H * D_QK * 2 + B * (P + N) * D_QK * 2
        n_sets = max(1, min(24, math.ceil(2.5 * l2_bytes / set_bytes))) if l2_bytes else 1
        tree, pl, sets = make_sets(B, N, H, P, n_sets, device, gen)
        real = tree.depth[tree.depth >= 0]
        tree_visible = float((real + 1).float().mean())
        timed = []   # the variants checked at this point, their graph timings still to take
        for v in names:
            plan = launch_plan_columns(v, batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms,
                                       impl=impl_of(v, device))
            if ceilings is not None and ceilings.kind == "gpu":
                cost = verify_attention_cost(v, batch=B, nodes=N, heads=H, prefix=P, tree_visible=tree_visible,
                                             num_sms=sms, impl=impl_of(v, device), l2_bytes=l2_bytes)
                floor_us = max(roof_times(cost, ceilings, "graph", "cold").values())
                need = predicted_seconds(floor_us, n_sets, quick)
                if need > budget_s:
                    notes.append(f"{v} N={N} P={P} B={B} H={H}: not timed (the model puts its timings at "
                                 f"{need:.0f} s of device time, over the {budget_s:g} s budget)")
                    continue
            try:
                rel, lse_err = check(v, *sets[0], pl, tree)
            except AssertionError as exc:
                notes.append(f"{v} N={N} P={P} B={B} H={H}: FAILED the check, not timed: {exc}")
                continue
            # Every name bound now: the eager timings run after the loop has moved on.
            fns = [lambda s=s, v=v, pl=pl, tree=tree: call(v, s[0], s[1], pl, tree) for s in sets]
            point = {"kernel": "verify_attention", "variant": v, "q_len": N, "prefix": P, "batch": B, "heads": H,
                     "tree_visible": tree_visible, "sets": n_sets, **plan}
            checked = {"check_rel": rel, "check_lse": lse_err}
            if device.type != "cuda":
                rows.append((point, rounds.host(fns[0], reps=3 if quick else 10, warmup=1),
                             {"floor_launches": math.nan, **checked}))
                continue
            floor, floor_launches = trivial_call(v, device, gen)
            p, eager = _eager_timings(fns, quick, floor, rounds)
            timed.append((point, checked, floor_launches, eager, fns, p))
        # The point's graph timings, every variant's replays in turn; rows in the order warm eager,
        # warm graph, cold eager, cold graph per variant.
        for (point, checked, launches, eager, _, _), graph in zip(timed, _graph_timings([j[4:] for j in timed])):
            for t in (eager[0], graph[0], eager[1], graph[1]):
                rows.append((point, t, {"floor_launches": launches if t.mode == "eager" else math.nan, **checked}))
    if progress and rounds.pending:
        print(f"verify attention: {rounds.pending} {'eager' if device.type == 'cuda' else 'host'} timings "
              f"in {rounds.rounds} rounds", flush=True)
    rounds.run()
    for line in notes:
        print(line)
    return pd.DataFrame([point | t.as_dict() | extra for point, t, extra in rows])


def main(argv=None) -> None:
    """Command line: the sweep over a grid, classified on the run's ceilings, saved as a table."""
    from kdtree.bench.ceilings import measure_ceilings
    from kdtree.bench.results import run_metadata, save_table
    from kdtree.bench.roofline import classify

    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/verify_attention")
    ap.add_argument("--q-lens", type=ints, default=[33, 65, 257])
    ap.add_argument("--prefixes", type=ints, default=[4096, 16384])
    ap.add_argument("--batches", type=ints, default=[1, 16])
    ap.add_argument("--heads", type=ints, default=[64])
    ap.add_argument("--variants", default="", help="comma-separated (default: every runnable variant)")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    ceilings = measure_ceilings(quick=a.quick)
    df = classify(run_attention_sweep(a.q_lens, a.prefixes, a.batches, a.heads,
                                      [v for v in a.variants.split(",") if v] or None,
                                      ceilings=ceilings, quick=a.quick), ceilings)
    path = save_table(df, a.out, run_metadata() | {"ceilings": ceilings.caption()})
    print(f"wrote {path}")
    cols = ["variant", "q_len", "prefix", "batch", "heads", "splits", "tail_splits", "mode", "l2", "median_us", "bound",
            "fraction", "diagnosis"]
    with pd.option_context("display.width", 250, "display.max_colwidth", 120):
        print(df[[c for c in cols if c in df.columns]].to_string(index=False))


if __name__ == "__main__":
    main()
