"""``kdtree bench tree``: GPU tree build against the CPU builds serving stacks run today.

One run times, per (budget, batch): the paper's reference path and the serving-stack path on
the CPU (device copies included), the GPU build eagerly and under CUDA-graph replay (with the
share of sequences that took the parallel path), the serial heap alone under graph replay (the
v5 kernel, the baseline of the parallel path), and greedy accept plus KV compaction. Every GPU
result is first checked bit-identical to the reference on the same inputs. On a machine without
a GPU only the CPU paths run.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

import kdtree
from kdtree.bench.ceilings import trivial_ops
from kdtree.bench.results import run_metadata, save_table
from kdtree.bench.timing import Rounds, Timing, time_graph
from kdtree.kernels import cuda_available
from kdtree.tree import _launch_build, accept_reference, build_tree_reference

GPU_BUDGETS = (16, 32, 64, 128, 256, 512, 1024)
GPU_BATCHES = (1, 8, 64)
CPU_BUDGETS = (16, 64, 256)
CPU_BATCHES = (1, 8)
VOCAB = 8192
PREFIX = 1024   # KV rows before the tree in the compaction benchmark
KV_DIM = 576    # MLA latent row: 512 + 64 rope, bf16


def draft_inputs(batch: int, depth: int, k: int, device, seed: int = 0):
    """Top-k log-probs of peaky random drafter logits, as ``topk_logprobs`` hands them over."""
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(batch, depth, VOCAB, generator=g, device=device) * 3.0
    return kdtree.topk_logprobs(logits, k)


def _row(kernel: str, variant: str, budget: int, batch: int, depth: int, k: int, t: Timing,
         **extra) -> tuple[dict, Timing, dict]:
    """A results row's point, its timing (filled in when a ``Rounds`` runs) and extra columns."""
    return {"kernel": kernel, "variant": variant, "budget": budget, "batch": batch, "depth": depth, "topk": k}, t, extra


def _same(a, b) -> bool:
    return all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu())
               for f in ("tokens", "parents", "depth", "num_nodes", "visibility"))


def bench_point(budget: int, batch: int, depth: int, gpu: bool, quick: bool, rounds: Rounds) -> list[tuple]:
    """All measurements at one (budget, batch), as ``_row`` triples; the host-path and eager
    timings are registered with ``rounds`` and taken when it runs. Raises if the GPU tree
    differs from the reference."""
    k = min(budget, VOCAB)
    dev = torch.device("cuda" if gpu else "cpu")
    lp, tok = draft_inputs(batch, depth, k, dev)
    cpu_reps = 3 if quick else (5 if batch * budget >= 64 * 256 else 15)
    rows = []
    for path in ("paper", "serving"):
        t = rounds.host(lambda path=path: build_tree_reference(lp, tok, budget, path=path), reps=cpu_reps,
                        warmup=1, sync=gpu)
        rows.append(_row("build", f"cpu_{path}", budget, batch, depth, k, t))
    if not gpu:
        return rows

    ref = build_tree_reference(lp, tok, budget)
    path = torch.full((batch,), -1, dtype=torch.int32, device=dev)
    tree = _launch_build(lp, tok, budget, path=path)
    heap = _launch_build(lp, tok, budget, serial=True)
    if not (_same(tree, ref) and _same(heap, ref)):
        raise AssertionError(f"GPU tree differs from the reference at budget={budget} batch={batch}")
    parallel = float((path == 0).float().mean())  # sequences on the parallel path
    reps = 30 if quick else 200
    e_reps = 100 if quick else 200      # eager calls are host dispatch (~0.1 ms): a median of 100
    floors = trivial_ops()   # each op's host floor, timed interleaved with its eager calls
    build = lambda: kdtree.build_tree(lp, tok, budget, validate=False)  # noqa: E731
    rows.append(_row("build", "gpu", budget, batch, depth, k,
                     rounds.events([build], reps=e_reps, floor=floors["build_tree"]), parallel=parallel))
    rows.append(_row("build", "gpu", budget, batch, depth, k, time_graph(build, reps=reps // 4), parallel=parallel))
    # The serial heap alone (v5, one warp per sequence): the baseline, timed in the same run.
    serial = lambda: _launch_build(lp, tok, budget, serial=True)  # noqa: E731
    rows.append(_row("build", "gpu_heap", budget, batch, depth, k, time_graph(serial, reps=reps // 4)))

    target = agreeing_target(tree)
    acc_ref = accept_reference(tree, target)
    acc = kdtree.accept_tree(tree, target)
    if not all(torch.equal(getattr(acc, f).cpu(), getattr(acc_ref, f).cpu()) for f in ("indices", "length", "bonus")):
        raise AssertionError(f"GPU accept differs from the reference at budget={budget} batch={batch}")
    prefix = torch.full((batch,), PREFIX, dtype=torch.int64, device=dev)
    kv = torch.randn(batch, PREFIX + budget + 1, KV_DIM, device=dev).to(torch.bfloat16)
    accept = lambda: kdtree.accept_tree(tree, target, validate=False)  # noqa: E731
    compact = lambda: kdtree.compact_kv(kv, prefix, acc, validate=False)  # noqa: E731
    both = lambda: kdtree.compact_kv(kv, prefix, kdtree.accept_tree(tree, target, validate=False), validate=False)  # noqa: E731
    shape = {"accepted": float(acc.length.float().mean()), "moved": moved_rows(acc)}
    for name, fn, op in (("accept", accept, "accept_tree"), ("compact", compact, "compact_kv"),
                         ("accept+compact", both, "accept+compact")):
        rows.append(_row(name, "gpu", budget, batch, depth, k, rounds.events([fn], reps=e_reps, floor=floors[op]), **shape))
        rows.append(_row(name, "gpu", budget, batch, depth, k, time_graph(fn, reps=reps // 4), **shape))
    return rows


def agreeing_target(tree, seed: int = 1) -> torch.Tensor:
    """Target tokens [B, N] (int64) that agree with the draft at 70% of the nodes' parents, so
    the accept walk goes most of the way down the tree."""
    dev = tree.tokens.device
    g = torch.Generator(device=dev).manual_seed(seed)
    target = torch.randint(0, VOCAB, tree.tokens.shape, generator=g, device=dev)
    agree = (torch.rand(tree.tokens.shape, generator=g, device=dev) < 0.7) & (tree.parents >= 0)
    par = tree.parents.clamp(min=0).long()
    target.scatter_(1, par, torch.where(agree, tree.tokens.long(), target.gather(1, par)))
    return target


def moved_rows(acc) -> float:
    """Mean KV rows per sequence that compaction moves: accepted rows not already in place."""
    idx = acc.indices.long()
    pos = torch.arange(idx.shape[1], device=idx.device)
    live = pos[None, :] < acc.length.long()[:, None]
    return float((live & (idx != pos[None, :])).sum(1).float().mean())


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One line per (budget, batch): medians, the GPU-vs-CPU speedups, accept+compact."""
    def med(kernel, variant, mode):
        sel = df[(df.kernel == kernel) & (df.variant == variant) & (df["mode"] == mode)]
        return sel.set_index(["budget", "batch"])["median_us"]

    out = pd.DataFrame({"paper_ms": med("build", "cpu_paper", "host") / 1e3,
                        "serving_ms": med("build", "cpu_serving", "host") / 1e3})
    if (df.variant == "gpu").any():
        out["gpu_eager_us"] = med("build", "gpu", "eager")
        out["gpu_graph_us"] = med("build", "gpu", "graph")
        out["heap_graph_us"] = med("build", "gpu_heap", "graph")
        sel = df[(df.kernel == "build") & (df.variant == "gpu") & (df["mode"] == "graph")]
        out["parallel"] = sel.set_index(["budget", "batch"])["parallel"]
        out["x_vs_paper"] = out.paper_ms * 1e3 / out.gpu_graph_us
        out["x_vs_serving"] = out.serving_ms * 1e3 / out.gpu_graph_us
        out["acc+compact_graph_us"] = med("accept+compact", "gpu", "graph")
    return out.reset_index()


def run_tree_bench(budgets=None, batches=None, depth: int = 15, out: str | Path | None = "results/tree_bench",
                   quick: bool = False, progress: bool = True) -> pd.DataFrame:
    """Run the sweep, print the summary table, write the tidy table to ``out`` (parquet + csv).

    Parameters
    ----------
    budgets, batches : sequences of int, optional
        Defaults: the full grid on a GPU; a small CPU-only grid otherwise.
    depth : int
        Draft depth L (K = budget, capped by the synthetic vocabulary).
    out : path without suffix, or None to skip writing.
    quick : fewer repetitions.
    """
    gpu = cuda_available()
    budgets = tuple(budgets or (GPU_BUDGETS if gpu else CPU_BUDGETS))
    batches = tuple(batches or (GPU_BATCHES if gpu else CPU_BATCHES))
    for b in budgets:
        if not 1 <= b <= kdtree.tree.MAX_BUDGET:
            raise ValueError(f"budgets: {b} is outside 1..{kdtree.tree.MAX_BUDGET}")
    if not gpu:
        print("no CUDA GPU (or no CuPy): timing the CPU paths only")
    rows, rounds = [], Rounds()
    points = [(bu, ba) for ba in batches for bu in budgets]
    for bu, ba in tqdm(points, desc="bench tree", disable=not progress):
        rows += bench_point(bu, ba, depth, gpu, quick, rounds)
    if progress:
        print(f"bench tree: {rounds.pending} host and eager timings in {rounds.rounds} rounds", flush=True)
    rounds.run()   # all points' host and eager timings, in rounds spread over all of them
    df = pd.DataFrame([point | t.as_dict() | extra for point, t, extra in rows])
    meta = run_metadata()
    if out is not None:
        path = save_table(df, out, meta)
        print(f"wrote {path} and {path.with_suffix('.csv')}")
    print(f"\ntree build, L={depth}, K=budget, on {meta.get('device')} (warm L2; CPU paths include copies)")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(summary(df).to_string(index=False))
    return df
