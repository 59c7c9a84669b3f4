"""The MoE layer as one expert-parallel rank runs it, its byte model and its benchmark.

CPU tests in float32 (the fp8 path through its dequantized reference); the ``gpu`` tests check
the bf16 kernel path (``kdtree.experts``: its grouped GEMMs against float64 on empty, one-token,
chunk-boundary, odd and one-expert groups, with and without the shared expert's extra group;
the router kernel against float64 at odd token counts, with exact ties, in a graph; the
permutation's invariants; five launches a layer; compute-sanitizer) and the fp8 path
(``torch._scaled_grouped_mm``) at Kimi K2's EP8 shard shapes, and their graph capture.
"""
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kdtree.bench.moe import (ROUTINGS, TOLERANCE, expected_distinct, moe_layer, moe_layer_cost, moe_reference,
                              routing_ids, run_moe_bench)
from kdtree.engine import get_config
from kdtree.engine.model import FP8, FP8_MAX, MoE, build_model, quantize_rows
from kdtree import experts as ek
from moe_cases import COUNTS, grouped_case, grouped_error


def _full_and_ranks(fp8=False):
    """tiny_ep's experts unsharded (one rank holding all 16) and the 4 ranks' shares of the same weights."""
    cfg = replace(get_config("tiny_ep"), expert_fp8=fp8)
    full = build_model(replace(cfg, expert_parallel=1), seed=2).layers[1].ffn
    ranks = []
    for r in range(4):
        m = build_model(cfg, seed=2).layers[1].ffn
        with torch.no_grad():
            for name in ("w1", "w2", "w3") + (("w1_scale", "w2_scale", "w3_scale") if fp8 else ()):
                getattr(m, name).copy_(getattr(full, name)[4 * r:4 * r + 4])
            m.gate.weight.copy_(full.gate.weight)
        ranks.append(m)
    return full, ranks


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("T", [1, 7, 33])
def test_ep_ranks_sum_to_the_whole_moe(gen, T, fp8):
    """Each rank computes only the slots routed to its 4 experts; the 4 ranks' outputs sum to the
    unsharded MoE's (what the combine all-reduce does on a deployment)."""
    full, ranks = _full_and_ranks(fp8)
    x = torch.randn(T, full.gate.weight.shape[1], generator=gen)
    weight, expert = full.route(x)
    whole = full.experts(x, weight, expert)
    parts = [m.experts(x, weight, (expert - 4 * r) % 16) for r, m in enumerate(ranks)]  # rank r's ids first
    torch.testing.assert_close(sum(parts), whole, atol=1e-5, rtol=1e-5)
    for r, part in enumerate(parts):   # a token with no slot on rank r gets exactly zero there
        none = ~(((expert >= 4 * r) & (expert < 4 * r + 4)).any(1))
        assert float(part[none].abs().sum()) == 0.0


@pytest.mark.parametrize("fp8", [False, True])
def test_experts_match_the_float64_reference(gen, fp8):
    moe = build_model(replace(get_config("tiny_ep"), expert_fp8=fp8), seed=5).layers[1].ffn
    x = torch.randn(13, moe.gate.weight.shape[1], generator=gen)
    weight, expert = moe.route(x)
    expert[0] = torch.tensor([0, 1, 2, 3])  # every slot of a token local, and ties of the sort
    expert[1] = torch.tensor([3, 3, 3, 3])
    ref = moe_reference(moe, x, weight, expert)
    torch.testing.assert_close(moe.experts(x, weight, expert).double(), ref, atol=1e-5, rtol=1e-5)
    assert float(ref.abs().max()) > 0.1


def test_router_scores_all_experts_and_holds_the_local_ones():
    cfg = get_config("kimi_k2_ep8")
    with torch.device("meta"):
        moe = MoE(cfg)
    assert moe.gate.weight.shape == (384, 7168) and moe.w1.shape == (48, 2048, 7168)
    assert moe.w2.shape == (48, 7168, 2048) and moe.k == 8 and moe.shared.w1.weight.shape == (256, 7168)


def test_quantize_rows_round_trip(gen):
    x = torch.randn(64, 256, generator=gen) * torch.logspace(-3, 3, 64)[:, None]
    x[5, 7] = 0.0
    q, s = quantize_rows(x)
    assert q.dtype == FP8 and s.dtype == torch.float32 and s.shape == (64,)
    back = q.float() * s[:, None]
    assert torch.equal(q.float().abs().amax(-1), torch.full((64,), FP8_MAX))  # the row max maps to 448
    normal = x.abs() >= s[:, None] * 2.0 ** -6      # e4m3 normal range: 3 mantissa bits, error <= 1/16
    assert bool(((back - x).abs() <= x.abs() / 16 + 1e-12)[normal].all())
    assert float(back[5, 7]) == 0.0


def test_expected_distinct_closed_form():
    assert expected_distinct(0, 8, 384, 48) == 0.0
    assert expected_distinct(1, 8, 384, 48) == pytest.approx(1.0)   # 48 * 8 / 384
    assert expected_distinct(10 ** 6, 8, 384, 48) == pytest.approx(48.0)
    assert expected_distinct(17, 8, 384, 48) == pytest.approx(48 * (1 - (1 - 8 / 384) ** 17))
    with pytest.raises(ValueError, match="k, local"):
        expected_distinct(4, 9, 8, 4)
    with pytest.raises(ValueError, match="tokens"):
        expected_distinct(-1, 2, 8, 4)


@pytest.mark.parametrize("T", [1, 17, 65, 257])
def test_uniform_routing_touches_the_closed_form_count(T):
    """Distinct local experts of uniform routing against E_l (1 - (1 - k/E)^T), over 300 draws."""
    g = torch.Generator().manual_seed(T)
    draws = []
    for _ in range(300):
        ids = routing_ids("uniform", T, 384, 8, generator=g)
        assert all(len(set(row.tolist())) == 8 for row in ids)  # k distinct experts per token
        draws.append(ids[ids < 48].unique().numel())
    d = torch.tensor(draws, dtype=torch.float64)
    mean, se = float(d.mean()), float(d.std() / 300 ** 0.5) + 1e-9
    assert abs(mean - expected_distinct(T, 8, 384, 48)) < 4 * se + 0.02, (mean, se)


def test_zipf_routing_is_skewed():
    g = torch.Generator().manual_seed(0)
    zipf = routing_ids("zipf", 257, 384, 8, zipf_a=1.2, generator=g)
    uniform = routing_ids("uniform", 257, 384, 8, generator=g)
    flat = routing_ids("zipf", 257, 384, 8, zipf_a=0.0, generator=g)
    assert zipf.unique().numel() < 0.8 * uniform.unique().numel()
    assert abs(flat.unique().numel() - uniform.unique().numel()) < 30  # a = 0 is uniform
    hits = torch.bincount(zipf.flatten(), minlength=384).sort(descending=True).values
    assert int(hits[0]) > 10 * max(int(hits[100]), 1)
    with pytest.raises(ValueError, match="zipf_a"):
        routing_ids("zipf", 4, 16, 2, zipf_a=-1.0)
    with pytest.raises(ValueError, match="kind"):
        routing_ids("model", 4, 16, 2)


def test_moe_layer_cost_hand_counts():
    """dim 4, inter 2, 8 experts, top-2, 3 tokens, 2 distinct local experts, 3 local slots, no shared."""
    kw = dict(tokens=3, distinct=2, local_slots=3, dim=4, inter=2, shared_inter=0, experts=8, k=2)
    bf16 = moe_layer_cost(**kw)
    assert bf16.bytes_min == 2 * 3 * 2 * 4 * 2 + 8 * 4 * 4 + 2 * 3 * 4 * 2   # experts + router + in/out
    assert bf16.flops == 2 * (3 * 3 * 2 * 4 + 3 * 8 * 4)
    fp8 = moe_layer_cost(**kw, weight_bytes=1)
    assert fp8.bytes_min == 2 * (3 * 2 * 4 + 4 * (2 * 2 + 4)) + 8 * 4 * 4 + 2 * 3 * 4 * 2
    assert fp8.launches > bf16.launches          # the activation quantization
    # the weights appear once in the HBM traffic, the activations' passes come on top
    assert bf16.dram_read >= 2 * 3 * 2 * 4 * 2 and bf16.l2_bytes > bf16.bytes_min
    shared = moe_layer_cost(**(kw | {"shared_inter": 2}))
    assert shared.bytes_min - bf16.bytes_min == 3 * 4 * 2 * 2
    with pytest.raises(ValueError, match="local_slots"):
        moe_layer_cost(**(kw | {"local_slots": 7}))
    with pytest.raises(ValueError, match="weight_bytes"):
        moe_layer_cost(**kw, weight_bytes=3)


def test_moe_layer_cost_kernel_path_hand_counts():
    """The kernel path: one router launch, then permute, the two grouped GEMMs with the shared
    expert's rows inside them, and the combine; same FLOPs and minimum bytes as the torch path."""
    kw = dict(tokens=3, distinct=2, local_slots=3, dim=4, inter=2, shared_inter=2, experts=8, k=2)
    torch_path = moe_layer_cost(**kw)
    kern = moe_layer_cost(**kw, router_kernel=True, expert_kernels=True)
    assert kern.launches == 5 and torch_path.launches == 6 + 10 + 2 + 2 + 1 + 6 + 6
    fused = moe_layer_cost(**kw, router_kernel=True, expert_kernels=True, router_permutes=True)
    assert fused.launches == 4 and fused.bytes_min == kern.bytes_min and "group the slots" in fused.parts[0].kernel
    with pytest.raises(ValueError, match="router_permutes"):
        moe_layer_cost(**kw, router_kernel=True, router_permutes=True)
    assert kern.flops == torch_path.flops and kern.bytes_min == torch_path.bytes_min
    gate_up, down = kern.parts[2], kern.parts[3]
    assert gate_up.flops_exec == 2 * 2 * (3 * 2 + 3 * 2) * 4       # 3 local slots and 3 shared rows
    assert down.dram_write == (3 + 3) * 4 * 4                       # float32 rows of both
    assert gate_up.dram_read >= 2 * 2 * 2 * 4 * 2 + 2 * 2 * 4 * 2    # routed gate/up and shared gate/up weights
    planes = ek.ROUTER_SLICES if ek.ROUTER_KERNEL == "mma" else 1    # the mma router: one score plane per K slice
    assert kern.parts[0].dram_write == planes * 3 * 8 * 4 + 3 * 2 * 12  # scores, then weights and ids
    assert kern.parts[0].dram_read == 8 * 4 * 4 + 3 * 4 * 2 + planes * 3 * 8 * 4
    no_shared = moe_layer_cost(**(kw | {"shared_inter": 0}), expert_kernels=True)
    assert no_shared.parts[-1].dram_read == 3 * 4 * 4 + 6 * 8        # local rows only, pos and weights
    with pytest.raises(ValueError, match="expert_kernels"):
        moe_layer_cost(**kw, weight_bytes=1, expert_kernels=True)


def test_reference_route_breaks_ties_by_the_lowest_id(gen):
    """The float64 router reference: the torch path's choice where scores differ, the lowest id
    among equal scores (the rule of ``kdtree.experts.route``)."""
    moe = build_model(get_config("tiny_ep"), seed=4).layers[1].ffn
    x = torch.randn(9, moe.gate.weight.shape[1], generator=gen)
    w, e = moe.route(x)
    rw, re = ek.reference_route(x, moe.gate.weight, moe.k, moe.scale)
    assert torch.equal(re, e) and torch.allclose(rw, w.double(), atol=1e-6)
    gate = moe.gate.weight.clone()
    gate[[9, 12]] = gate[2].clone()               # three equal rows: equal scores for every token
    x[0] = gate[2] * 50                           # ... and the best ones for token 0
    _, re = ek.reference_route(x, gate, 2, 1.0)
    assert re[0].tolist() == [2, 9]


def test_router_kernel_rejects_bad_input():
    x = torch.zeros(4, 1024, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="x: expected a bf16 CUDA tensor"):
        ek.route(x, torch.zeros(32, 1024), 2, 1.0)
    assert not ek.router_supported(x, torch.zeros(32, 1024), 2)
    assert [ek.router_shape(T) for T in (1, 65, 128, 129, 1025)] == [(4, 8), (4, 8), (4, 8), (4, 64), (4, 64)]
    assert [ek.router_mma_shape(T, 384) for T in (1, 8, 9, 17, 64, 65, 1025)] == [
        (3, 1), (3, 1), (3, 2), (3, 3), (3, 8), (3, 8), (3, 8)]
    assert ek.router_mma_shape(5, 32) == (2, 1) and ek.router_mma_shape(5, 96) == (3, 1)


def test_bench_records_a_failed_check_and_goes_on(monkeypatch):
    """A point whose output misses the reference is recorded with the error and never timed."""
    import kdtree.bench.moe as bench

    def check(moe, *args):
        if moe.fp8:
            raise AssertionError("MoE experts differ from the float64 reference: relative error 0.5")
        return 0.0

    monkeypatch.setattr(bench, "_check", check)
    df = run_moe_bench("tiny_ep", tokens=(3,), routings=("uniform",), fp8=True)
    bad, good = df[df.variant == "fp8-ref"].iloc[0], df[df.variant == "float32"].iloc[0]
    assert bad.error.startswith("AssertionError") and bad.isna()["median_us"]
    assert good.error == "" and good.median_us > 0


def test_bench_rows_on_cpu():
    df = run_moe_bench("tiny_ep", tokens=(1, 9), fp8=True)
    assert set(df.routing) == set(ROUTINGS) and set(df.variant) == {"float32", "fp8-ref"}
    assert len(df) == 2 * 3 * 2
    assert (df.distinct <= df.local_experts).all() and (df[df.tokens == 1].distinct <= 4).all()
    assert (df.local_slots <= df.tokens * 4).all() and (df.check_error < 1e-4).all()
    assert ((df.p20_us <= df.median_us) & (df.median_us <= df.p80_us)).all() and (df.error == "").all()
    with pytest.raises(ValueError, match="routings"):
        run_moe_bench("tiny_ep", routings=("lucky",))
    with pytest.raises(ValueError, match="tokens"):
        run_moe_bench("tiny_ep", tokens=(0,))


def test_fp8_tolerance_covers_one_requantization():
    """The fp8 bound (TOLERANCE[True]) against what it must absorb: the down projection's input
    differing by one bf16 step in each row's largest element, which moves the row's e4m3 scale and
    re-rounds every element. Over a 2048-long reduction that costs a few percent, well above the
    bf16 bound and within 2^-4; a tighter fp8 bound would fail on rounding alone."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 2048, generator=g).to(torch.bfloat16)
    w = torch.randn(512, 2048, generator=g, dtype=torch.float64) / 2048 ** 0.5
    h2, rows = h.clone(), torch.arange(64)
    top = h.float().abs().argmax(-1)
    h2[rows, top] = (h[rows, top].float() * (1 + 2 ** -7)).to(torch.bfloat16)   # one bf16 step
    assert ((h2.float() - h.float()).abs().max(-1).values > 0).all()
    (q1, s1), (q2, s2) = quantize_rows(h.float()), quantize_rows(h2.float())
    y1, y2 = (q1.double() * s1.double()[:, None]) @ w.T, (q2.double() * s2.double()[:, None]) @ w.T
    err = float((y1 - y2).abs().max() / y1.abs().max())
    assert TOLERANCE[False] < err <= TOLERANCE[True]


# ---- GPU ----

@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("T", [1, 40])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_moe_at_kimi_ep8_shapes(fp8, T):
    """bf16 (the kernels; at one token the gate/up GEMM on its small shape) and fp8
    (torch._scaled_grouped_mm, per-row scales) against the float64 reference at the EP8 shard's
    shapes; the graph replay equals the eager call."""
    cfg = replace(get_config("kimi_k2_ep8"), expert_fp8=fp8)
    moe = moe_layer(cfg, "cuda", torch.bfloat16, seed=1)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, cfg.dim, device="cuda", generator=g).to(torch.bfloat16)
    weight, expert = moe.route(x)
    expert[:4] = torch.tensor([0, 1, 2, 3, 4, 5, 6, 47], device="cuda")  # all-local tokens
    got = moe.experts(x, weight, expert)
    ref = moe_reference(moe, x, weight, expert)
    assert float((got.double() - ref).abs().max()) <= TOLERANCE[fp8] * float(ref.abs().max())
    graph = torch.cuda.CUDAGraph()
    out = moe.experts(x, weight, expert)
    with torch.cuda.graph(graph):
        out = moe.experts(x, weight, expert)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)


@pytest.mark.gpu
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("nt", [1, 2, 4])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("case", list(COUNTS))
def test_grouped_gemm_against_float64(case, gated, nt, gather):
    """Fresh random inputs per case; empty experts, one token, chunk boundaries, odd counts, every
    token on one expert; K = 768 (three 64-wide steps per warp), N not a power of two."""
    got, ref, _ = grouped_case(COUNTS[case], 768, 80 if gated else 96, gated, nt, seed=list(COUNTS).index(case),
                               gather=gather)
    err, bound = grouped_error(got, ref, gated)
    assert err <= bound, f"relative error {err:.3g} > {bound:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("nt", [1, 4])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("tokens", [1, 9, 70])
@pytest.mark.parametrize("case", ["mixed", "none"])
def test_grouped_gemm_shared_group_against_float64(case, tokens, gated, nt, gather):
    """The shared expert as an extra group: its own row count and K (gate/up: K of x; down: a
    shorter K than the routed experts'), over ``tokens`` positions after the routed rows, in
    chunks of 8 nt (one and several chunks, a partial last one)."""
    shared = (48, 768, tokens) if gated else (64, 256, tokens)
    got, ref, _ = grouped_case(COUNTS[case], 768, 80 if gated else 96, gated, nt, seed=tokens, gather=gather,
                               shared=shared)
    err, bound = grouped_error(got, ref, gated)
    assert err <= bound, f"relative error {err:.3g} > {bound:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("rows, groups", [(1, "nz"), (2, "nz"), (3, "all"), ("groups", "all")])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("case", ["mixed", "one_expert", "none"])
def test_grouped_gemm_routed_rows_walk_the_active_list(case, gated, rows, groups):
    """Fewer routed grid rows than experts with tokens (each block takes several in turn), more
    (empty blocks), ``groups`` past the active ones (a -1 ends the walk), with the shared
    expert's rows before them: the same float64 reference."""
    nz = sum(1 for c in COUNTS[case] if c)
    g = len(COUNTS[case]) if groups == "all" else max(1, nz)
    grid = dict(groups=g, rows_routed=g if rows == "groups" else min(rows, g))
    shared = (48, 768, 11) if gated else (64, 256, 11)
    got, ref, _ = grouped_case(COUNTS[case], 768, 80 if gated else 96, gated, 1, seed=7, gather=True,
                               shared=shared, grid=grid)
    err, bound = grouped_error(got, ref, gated)
    assert err <= bound, f"relative error {err:.3g} > {bound:.3g}"


def _router_case(T, D, E, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(torch.bfloat16)
    gate = torch.randn(E, D, generator=g) * D ** -0.5
    return x, gate


def _assert_route_matches(x, gate, k, scale, weight, expert, tol=1e-5):
    """Each token's k ids distinct, best first, and a top k of the float64 scores up to ``tol``
    (float32 accumulation over dim); the weights renormalised over the chosen ones in float64."""
    s = torch.sigmoid(x.double() @ gate.double().T)
    e, w = expert.cpu(), weight.cpu().double()
    assert e.dtype == torch.int64 and w.dtype == torch.float64
    assert all(len(set(row.tolist())) == k for row in e)
    chosen = s.gather(1, e)
    rest = s.scatter(1, e, float("-inf")).amax(1)
    assert bool((chosen.amin(1) >= rest - tol).all())                     # a top k
    assert bool((chosen[:, :-1] >= chosen[:, 1:] - tol).all())             # best first
    torch.testing.assert_close(w, chosen / chosen.sum(1, keepdim=True) * scale, atol=tol * scale, rtol=tol)


ROUTER_VARIANTS = [("fma", None), ("fma", (2, 8)), ("fma", (2, 64)), ("mma", None)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, shape", ROUTER_VARIANTS)
@pytest.mark.parametrize("T", [1, 7, 8, 17, 32, 33, 64, 65, 128, 130, 1025])
def test_router_kernel_against_float64(T, kernel, shape):
    """Kimi K2's router shape (dim 7168, 384 experts, top 8) on fresh random inputs: both
    kernels; the fma one's expert-tile widths and token-tile lengths (odd T, partial tiles); the
    mma one's 1..8 n-tiles (partial ones), several 64-token passes (T > 64) and finalisers taking
    more than one 4-token group (T > 128)."""
    x, gate = _router_case(T, 7168, 384, 8, seed=torch.seed() % 2**31)
    w, e = ek.route(x.cuda(), gate.cuda(), 8, 2.827, shape=shape, kernel=kernel)
    _assert_route_matches(x, gate, 8, 2.827, w, e)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["fma", "mma"])
@pytest.mark.parametrize("E, k", [(32, 3), (64, 6), (96, 8)])
@pytest.mark.parametrize("T", [1, 13, 97])
def test_router_kernel_small_shape(T, E, k, kernel):
    """dim 1024 (one float4 per thread in the fma kernel, one k16 step per warp in the mma one),
    32 experts (one score per lane; two m-tiles, one expert tile), 64 (two expert tiles) and 96
    (three m-tiles per block)."""
    x, gate = _router_case(T, 1024, E, k, seed=torch.seed() % 2**31)
    w, e = ek.route(x.cuda(), gate.cuda(), k, 1.0, kernel=kernel)
    _assert_route_matches(x, gate, k, 1.0, w, e)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["fma", "mma"])
@pytest.mark.parametrize("T", [5, 70])
def test_router_kernel_ties_go_to_the_lowest_id(T, kernel):
    """Equal gate rows give bitwise-equal float32 scores (in different m-tile rows, blocks and
    expert tiles); among them the lowest ids win, at the k boundary too, as in the float64
    reference."""
    x, gate = _router_case(T, 7168, 384, 8, seed=torch.seed() % 2**31)
    gate[[9, 200, 383]] = gate[5].clone()                  # four equal experts
    x[:3] = (gate[5] * 60).to(torch.bfloat16)              # ... the best ones of tokens 0..2
    w, e = ek.route(x.cuda(), gate.cuda(), 2, 1.0, kernel=kernel)
    assert e[:3].cpu().tolist() == [[5, 9]] * 3 and torch.equal(w[:3].cpu(), torch.full((3, 2), 0.5))
    assert torch.equal(e[:3].cpu(), ek.reference_route(x[:3], gate, 2, 1.0)[1])
    _assert_route_matches(x, gate, 2, 1.0, w, e)
    w8, e8 = ek.route(x.cuda(), gate.cuda(), 8, 1.0, kernel=kernel)
    assert e8[:3, :4].cpu().tolist() == [[5, 9, 200, 383]] * 3


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["fma", "mma"])
@pytest.mark.parametrize("T", [17, 130])
def test_router_kernel_captures_and_resets_its_counters(T, kernel):
    """In a CUDA graph and eagerly around it: the same outputs every time (each launch leaves its
    counters at zero for the next), T = 0 gives empty outputs."""
    x, gate = _router_case(T, 7168, 384, 8, seed=1)
    x, gate = x.cuda(), gate.cuda()
    w0, e0 = ek.route(x, gate, 8, 2.5, kernel=kernel)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, e = ek.route(x, gate, 8, 2.5, kernel=kernel)
    for _ in range(3):
        graph.replay()
        w1, e1 = ek.route(x, gate, 8, 2.5, kernel=kernel)
    torch.cuda.synchronize()
    assert torch.equal(w, w0) and torch.equal(e, e0) and torch.equal(w1, w0) and torch.equal(e1, e0)
    assert ek._COUNTERS[torch.cuda.current_device()].abs().sum() == 0
    w, e = ek.route(x[:0], gate, 8, 2.5, kernel=kernel)
    assert w.shape == (0, 8) and e.shape == (0, 8)


@pytest.mark.gpu
def test_router_kernels_agree():
    """The two kernels choose the same experts on Kimi K2's router shape (their float32 sums
    differ in order only: weights within float32 rounding of each other)."""
    x, gate = _router_case(65, 7168, 384, 8, seed=torch.seed() % 2**31)
    x, gate = x.cuda(), gate.cuda()
    wf, ef = ek.route(x, gate, 8, 2.5, kernel="fma")
    wm, em = ek.route(x, gate, 8, 2.5, kernel="mma")
    s = torch.sigmoid(x.double() @ gate.double().T)
    close = (s.gather(1, ef) - s.gather(1, em)).abs().amax(1) < 1e-5      # a near-tie may swap
    assert close.all() and (ef == em).float().mean() > 0.99
    torch.testing.assert_close(wm[(ef == em).all(1)], wf[(ef == em).all(1)], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("T, launches", [(1, 4), (4, 4), (5, 5), (17, 5)])
def test_kernel_layer_launches(T, launches):
    """Router, permute, gate/up, down, combine: the whole bf16 layer, shared expert included; up
    to 4 tokens the router permutes too."""
    from kdtree.bench.moe import count_kernels

    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16, seed=3)
    x = torch.randn(T, moe.w1.shape[2], device="cuda").to(torch.bfloat16)
    assert moe.use_kernels(x) and moe.use_router_kernel(x)
    assert count_kernels(lambda: moe(x)) == launches
    assert not moe.use_router_kernel(torch.zeros(ek.ROUTER_MAX_TOKENS + 1, x.shape[1], device="cuda",
                                                 dtype=torch.bfloat16))   # cuBLAS's GEMM is faster there


@pytest.mark.gpu
def test_permute_invariants():
    g = torch.Generator(device="cuda").manual_seed(3)
    T, k, E, El = 257, 8, 384, 48
    expert = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(T)])
    expert[:5] = torch.arange(8, device="cuda")              # all-local tokens
    expert[5] = torch.arange(100, 108, device="cuda")        # nothing local
    _assert_permutation(expert, El, *ek.permute(expert, El))


def _assert_permutation(expert, El, offs, rowidx, pos, active):
    """``permute``'s outputs for expert [T, k] over El local experts: group ends, the experts with
    tokens, every local slot at a position inside its group, each position's token, -1 for
    other ranks' slots, row 0 past the last position."""
    T, k = expert.shape
    flat = expert.flatten().cpu()
    local = flat < El
    counts = torch.bincount(flat[local], minlength=El)
    assert torch.equal(offs.cpu().long(), counts.cumsum(0))
    nz = torch.nonzero(counts).flatten()
    assert torch.equal(active.cpu().long(), torch.cat((nz, torch.full((El - nz.numel(),), -1))))
    p = pos.cpu().long()
    assert (p[~local] == -1).all() and torch.equal(p[local].sort().values, torch.arange(int(local.sum())))
    assert torch.equal(rowidx.cpu().long()[p[local]], torch.arange(T * k)[local] // k)
    ends = offs.cpu().long()
    starts = torch.cat((torch.zeros(1, dtype=torch.long), ends[:-1]))
    assert ((starts[flat[local]] <= p[local]) & (p[local] < ends[flat[local]])).all()  # inside its group
    assert (rowidx.cpu()[int(local.sum()):] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("D, E, k, El", [(7168, 384, 8, 48), (1024, 32, 3, 8), (1024, 96, 8, 96), (1024, 64, 6, 1)])
def test_route_permuted_matches_route_then_permute(T, D, E, k, El):
    """Up to 4 tokens the router's finaliser groups the slots itself: the same weights and ids
    as ``route`` bit for bit, and ``permute``'s invariants (all experts local, one local expert,
    Kimi K2's shard); from 5 tokens the permutation kernel runs after the router."""
    x, gate = _router_case(T, D, E, k, seed=torch.seed() % 2**31)
    x, gate = x.cuda(), gate.cuda()
    w, e, perm = ek.route_permuted(x, gate, k, 2.5, El)
    assert ek.router_permutes(T) == (T <= ek.ROUTER_FUSED_PERMUTE)
    w0, e0 = ek.route(x, gate, k, 2.5)
    assert torch.equal(w, w0) and torch.equal(e, e0)
    _assert_permutation(e, El, *perm)
    for bad in (0, 1025, True):
        with pytest.raises(ValueError, match="n_local: expected an int in 1..1024"):
            ek.route_permuted(x, gate, k, 2.5, bad)


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("T", [1, 4, 65])
def test_kernel_path_matches_torch_path_and_captures(T):
    """The whole layer (router, kernels, shared expert added in the combine) against the torch
    path on the same weights at the EP8 shard's shapes, eager and in a graph; at 1 and 4 tokens
    the router also groups the slots."""
    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16, seed=2)
    x = torch.randn(T, moe.w1.shape[2], device="cuda").to(torch.bfloat16)
    assert moe.use_kernels(x)
    got = moe(x)
    moe.backend = "torch"
    ref = moe(x)
    moe.backend = "auto"
    assert float((got.double() - ref.double()).abs().max()) <= 0.02 * float(ref.double().abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)


@pytest.mark.gpu
def test_moe_kernels_under_compute_sanitizer():
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(exe):
        pytest.skip("compute-sanitizer not installed")
    script = Path(__file__).with_name("sanitize_moe.py")
    res = subprocess.run([exe, "--tool", "memcheck", sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "ERROR SUMMARY: 0 errors" in out and "selfcheck ok" in out, out[-3000:]


@pytest.mark.gpu
def test_grouped_gemm_rejects_bad_grid_rows():
    """``groups`` and ``active`` are checked before the launch, each error naming its argument."""
    x = torch.zeros(4, 256, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(3, 32, 256, dtype=torch.bfloat16, device="cuda")
    offs = torch.tensor([2, 4, 4], dtype=torch.int32, device="cuda")
    active = torch.tensor([0, 1, -1], dtype=torch.int32, device="cuda")
    for bad in (0, 4, 1.5):
        with pytest.raises(ValueError, match="groups: expected an int in 1..3"):
            ek.grouped_gemm(x, w, offs, 4, active=active, groups=bad)
    with pytest.raises(ValueError, match=r"active: expected int32 \[3\]"):
        ek.grouped_gemm(x, w, offs, 4, active=active.long(), groups=2)
    with pytest.raises(ValueError, match="groups: expected 3 .* without active"):
        ek.grouped_gemm(x, w, offs, 4, groups=2)
    for bad in (0, 3, True):
        with pytest.raises(ValueError, match=r"rows_routed: expected an int in 1..2 \(groups\)"):
            ek.grouped_gemm(x, w, offs, 4, active=active, groups=2, rows_routed=bad)
    with pytest.raises(ValueError, match="rows_routed: expected 3 .* without active"):
        ek.grouped_gemm(x, w, offs, 4, rows_routed=1)


def test_kernel_entry_points_reject_bad_input():
    """Checked before anything launches (runs without a GPU: CPU tensors are refused first)."""
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    w = torch.zeros(2, 32, 256, dtype=torch.bfloat16)
    offs = torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="x: expected a bf16 CUDA tensor"):
        ek.grouped_gemm(x, w, offs, 4)
    with pytest.raises(TypeError, match="expert: expected an int64 CUDA tensor"):
        ek.permute(torch.zeros(3, 2, dtype=torch.int64), 4)
    with pytest.raises(TypeError, match="x: expected a bf16 CUDA tensor"):
        ek.route_permuted(x, torch.zeros(32, 256), 2, 1.0, 4)
    with pytest.raises(ValueError, match="ys: expected contiguous float32"):
        ek.combine(torch.zeros(4, 6), torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="shared_first"):
        ek.combine(torch.zeros(4, 8), torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2), 3)
    assert not ek.supported(x, w, w, 2)                       # CPU tensors take the torch path
    small = ek.GATE_UP_SMALL_SHAPE
    assert ek.gate_up_shape(1, 7168) == small and ek.gate_up_shape(ek.GATE_UP_SMALL_T, 7168) == small
    assert ek.gate_up_shape(ek.GATE_UP_SMALL_T + 1, 7168) is None   # more tokens: SHAPES
    assert ek.gate_up_shape(1, 64 * small[0] + 256) is None          # K not in whole steps of its warps
    gu, down = ek.layer_gemm_options(1, 8, 384, 48, 7168)          # one token: one expert and the shared one
    assert down == {"nt": 1, "shared_first": 8, "groups": 8, "rows_routed": 1}
    assert gu == down | {"shape": small}
    gu, down = ek.layer_gemm_options(65, 8, 384, 48, 7168)         # more slots than local experts
    rows = math.ceil(expected_distinct(65, 8, 384, 48))              # 35.6 on average: 36 rows
    assert down == {"nt": 1, "shared_first": 520, "groups": 48, "rows_routed": rows}
    assert gu == down | {"shape": None} and rows == 36
    assert ek.layer_gemm_options(10 ** 4, 8, 384, 48, 7168)[1]["rows_routed"] == 48   # every local expert
    assert [ek.chunk_tiles(T, 8, 384) for T in (1, 65, 257, 1025)] == [1, 1, 2, 4]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k,rows_per_block", [(64, 7168, 32), (96, 2048, 16), (40, 512, 8), (32, 1024, 32)])
@pytest.mark.parametrize("contiguous", [False, True], ids=["rows", "contiguous"])
def test_the_read_probe_reads_every_word_once(rows, k, rows_per_block, contiguous, monkeypatch):
    """``scripts/moe_read_probe.py``'s ``rows_probe`` in both patterns reads each 16 bytes of the
    matrix exactly once: the XOR of its threads' XORs is the matrix's (first ^ last word of every
    16 bytes; random words, so a word missed or read twice shows)."""
    import runpy

    root = Path(__file__).resolve().parent.parent
    monkeypatch.syspath_prepend(str(root / "scripts"))
    probe = runpy.run_path(str(root / "scripts" / "moe_read_probe.py"))
    gen = torch.Generator(device="cuda").manual_seed(rows + k)
    m = torch.randint(-2 ** 31, 2 ** 31 - 1, (rows, k // 2), dtype=torch.int32, device="cuda", generator=gen)
    sink = torch.zeros(rows // rows_per_block, 128, dtype=torch.int32, device="cuda")
    probe["read_rows"](m.view(torch.int16), rows_per_block, contiguous, sink, all_=True)
    words = m.view(-1, 4)

    def xor_all(t):
        t = t.flatten().to(torch.int64) & 0xFFFFFFFF
        while t.numel() > 1:
            t = torch.cat([t, t.new_zeros(t.numel() % 2)]).view(-1, 2)
            t = t[:, 0] ^ t[:, 1]
        return int(t[0])

    assert xor_all(sink) == xor_all(words[:, 0] ^ words[:, 3]) != 0
