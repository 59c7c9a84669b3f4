"""GPU tests of the torch engine: bf16 losslessness up to rounding, and CUDA-graph capture.

Kimi K2 attention shapes (latent 512 + 64, 8 or 64 heads) with 2 layers and a 32k vocabulary,
so the verify forward runs through ``kdtree.verify_attention`` and the tree kernels. Run with
``-s`` to see the divergence report.
"""
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from kdtree.bench.engine_bench import self_consistent_run, step_breakdown, throughput_sweep
from kdtree.engine import (SyntheticDrafter, allocate_cache, build_model, chain_tree, generate, get_config,
                           get_drafter_config)
from kdtree.engine.model import MoE

pytestmark = pytest.mark.gpu

NEW = 64
LENGTHS = (33, 250, 7, 120)


def _model(preset):
    cfg = replace(get_config(preset), n_layers=2, vocab_size=32768)
    return build_model(cfg, seed=0, device="cuda", dtype=torch.bfloat16)


def _prompts(vocab, lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).cuda() for n in lengths]


def _drafter(model, reference, accuracy=0.85):
    d = SyntheticDrafter(get_drafter_config("tiny"), model.cfg.vocab_size, accuracy=accuracy,
                         device="cuda", dtype=model.embed.weight.dtype)
    d.set_reference(reference)
    return d


def _ulps(x: torch.Tensor) -> torch.Tensor:
    """One bf16 unit in the last place at |x|."""
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -20))) - 7)


@contextmanager
def _last_token_routes(model):
    """Collect, per MoE layer in order, the routing scores [E] (float32) that each forward inside
    the block computes for its last token (one sequence per forward)."""
    moes, seen = [b.ffn for b in model.layers if isinstance(b.ffn, MoE)], []

    def recorder(moe):
        def scores(x):
            out = MoE.scores(moe, x)
            seen.append(out[-1].clone())
            return out
        return scores

    for moe in moes:
        moe.scores = recorder(moe)  # an instance attribute shadows the method, for this block only
    try:
        yield seen
    finally:
        for moe in moes:
            del moe.scores


@torch.no_grad()
def _next_logits_two_ways(model, ctx):
    """The target's logits [vocab] after ``ctx``, computed by a prefill of all of ``ctx`` and by
    a prefill of ``ctx[:-1]`` plus one decode step: their difference is the bf16 rounding noise
    between two computation paths of the same numbers. Also, per MoE layer, the routing scores
    [E] of ctx's last token on each path."""
    n, dt = ctx.numel(), model.embed.weight.dtype
    lens = torch.tensor([n], device="cuda")
    with _last_token_routes(model) as full_routes:
        full = model(ctx[None], chain_tree(lens, n), allocate_cache(model.cfg, 1, n, "cuda", dt), nodes=lens - 1)
    cache = allocate_cache(model.cfg, 1, n, "cuda", dt)
    model(ctx[None, :-1], chain_tree(lens - 1, n - 1), cache, nodes=lens - 2)
    cache.lengths.fill_(n - 1)
    with _last_token_routes(model) as step_routes:
        step = model(ctx[None, -1:], chain_tree(torch.ones_like(lens), 1), cache, nodes=lens * 0)
    return full[0].float(), step[0].float(), full_routes, step_routes


def _routing(model, full_routes, step_routes) -> dict:
    """Whether the two paths route ctx's last token to different top-k expert sets (in which MoE
    layers); how close the routing was to a swap (the smallest gap between the k-th and the
    (k+1)-th routing score on the prefill path); and the routing scores' own two-path noise
    (the largest score difference between the paths)."""
    k = model.cfg.n_active_experts
    layers = [i for i, b in enumerate(model.layers) if isinstance(b.ffn, MoE)]
    assert len(full_routes) == len(step_routes) == len(layers)
    flips = [layer for layer, a, b in zip(layers, full_routes, step_routes)
             if set(a.topk(k).indices.tolist()) != set(b.topk(k).indices.tolist())]
    tops = [s.topk(k + 1).values for s in full_routes]
    margin = min(float(v[k - 1] - v[k]) for v in tops)
    noise = max(float((a - b).abs().max()) for a, b in zip(full_routes, step_routes))
    return {"route_flip": bool(flips), "route_flip_layers": flips, "route_margin": round(margin, 6),
            "route_noise": round(noise, 6)}


@torch.no_grad()
@pytest.mark.parametrize("preset", ["kimi_k2_tp8", "kimi_k2_attn"])
@pytest.mark.parametrize("budget", [4, 64])
def test_bf16_ddtree_diverges_only_at_rounding_ties(preset, budget):
    """Where DDTree and greedy part, the target's two candidate logits are closer than twice the
    rounding noise between two ways of computing them (random-weight logits are N(0, 1) over
    32k tokens, so their top-2 gaps are themselves only ~10 bf16 ulps: an ulp count alone would
    not separate a tie from a bug)."""
    model = _model(preset)
    prompts = _prompts(model.cfg.vocab_size)
    ar = generate(model, prompts, NEW)
    dd = generate(model, prompts, NEW, mode="ddtree", drafter=_drafter(model, ar.tokens), budget=budget)
    report = []
    for b, p in enumerate(prompts):
        diff = (ar.tokens[b] != dd.tokens[b]).nonzero()
        if len(diff) == 0:
            continue
        t = int(diff[0])
        full, step, full_routes, step_routes = _next_logits_two_ways(model, torch.cat((p, ar.tokens[b, :t])))
        a, d = int(ar.tokens[b, t]), int(dd.tokens[b, t])
        gap, noise = float((full[a] - full[d]).abs()), float((full - step).abs().max())
        report.append({"seq": b, "index": t, "gap": round(gap, 4), "noise": round(noise, 4),
                       "gap_ulps": round(gap / float(_ulps(full[a])), 1),
                       **_routing(model, full_routes, step_routes)})
    print(f"\n{preset} budget={budget}: {len(report)}/{len(prompts)} sequences diverged from greedy "
          f"within {NEW} tokens; tau={dd.mean_accepted:.2f}; {report}")
    # A rounding tie in either discrete decision of the step: the final argmax (the logit gap
    # within twice the two-path noise) or the MoE routing (the k-th/(k+1)-th score margin within
    # twice the routing scores' two-path noise: a near-tied router sends the token to another
    # expert on another path, and its logits move by far more than rounding).
    beyond = [r for r in report if r["gap"] > 2 * r["noise"] and r["route_margin"] > 2 * r["route_noise"]]
    assert not beyond, (f"divergence beyond a rounding tie of the argmax or of the routing: {beyond} "
                        f"(route_flip: the two paths route the last context token to different experts in "
                        f"route_flip_layers; route_margin: its smallest k-th vs (k+1)-th routing score gap; "
                        f"route_noise: the routing scores' two-path difference); all: {report}")
    # Acceptance is measured on the self-consistent run (the drafter drafts the path the run
    # decodes; see kdtree.bench.engine_bench.self_consistent_run): past a divergence, the reference
    # above drafts for another context.
    run, _, rounds = self_consistent_run(model, prompts, NEW, _drafter(model, ar.tokens), ar.tokens, budget)
    print(f"self-consistent run: tau={run.mean_accepted:.2f} after {rounds} reference rounds")
    assert run.mean_accepted > 2.0


@torch.no_grad()
@pytest.mark.parametrize("budget", [1, 16, 64])
def test_float32_cuda_is_lossless(budget):
    """tiny in float32 on CUDA: the tree kernels in the loop, exact agreement with greedy."""
    model = build_model(get_config("tiny"), seed=0, device="cuda")
    prompts = _prompts(model.cfg.vocab_size, (5, 70, 17))
    ar = generate(model, prompts, NEW)
    dd = generate(model, prompts, NEW, mode="ddtree", drafter=_drafter(model, ar.tokens), budget=budget)
    assert torch.equal(dd.tokens, ar.tokens)


@torch.no_grad()
@pytest.mark.parametrize("mode,budget", [("ar", 1), ("ddtree", 16), ("ddtree", 256)])
def test_graph_replay_equals_eager(mode, budget):
    """The captured step replays exactly what the eager step computes (same kernels, same order)."""
    model = _model("kimi_k2_tp8")
    prompts = _prompts(model.cfg.vocab_size)
    ar = generate(model, prompts, NEW)
    drafter = _drafter(model, ar.tokens) if mode == "ddtree" else None
    eager = generate(model, prompts, NEW, mode=mode, drafter=drafter, budget=budget)
    graph = generate(model, prompts, NEW, mode=mode, drafter=drafter, budget=budget, cuda_graph=True)
    assert torch.equal(graph.tokens, eager.tokens)
    assert torch.equal(graph.accepted, eager.accepted)
    print(f"\n{mode} budget={budget}: eager {eager.seconds * 1e3:.1f} ms, graph {graph.seconds * 1e3:.1f} ms "
          f"for {eager.steps} steps (unwarmed, includes capture)")


@torch.no_grad()
def test_breakdown_and_sweep_run_in_graphs():
    """The measurement entry points run end to end under graph replay (numbers: scripts/engine_bench.py)."""
    model = _model("kimi_k2_tp8")
    prompts = _prompts(model.cfg.vocab_size)
    drafter = _drafter(model, torch.zeros(len(prompts), 1, dtype=torch.long, device="cuda"))
    refs = {}
    rows = throughput_sweep(model, prompts, 32, drafter, budgets=(16, 64), cuda_graph=True, references=refs)
    print("\n" + "\n".join(str({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
                           for r in rows))
    assert all(r["tokens_per_s"] > 0 for r in rows) and rows[-1]["tau"] > 2.0
    # each run drafts from the continuation it decodes (bf16 ties may part it from greedy decoding)
    assert all(r["self_consistent"] for r in rows), rows
    assert all(r["lossless"] == (r["first_divergence"] == -1) == (r["agree_ar"] == 1.0) for r in rows)
    drafter.set_reference(refs[("ddtree", 64, True)])
    by = {r["phase"]: r for r in step_breakdown(model, prompts, drafter=drafter, budget=64, steps=5,
                                                timing="graph", max_new_tokens=32)}
    assert all(by[p]["median_us"] > 0 for p in ("draft", "topk", "build", "verify", "accept", "compact",
                                                "commit", "step", "host", "verify.attention"))
    print("\n" + ", ".join(f"{p} {r['median_us']:.0f} us" for p, r in by.items()))
