"""The MoE layer as one expert-parallel rank runs it, its byte model and its benchmark.

CPU tests in float32 (the fp8 path through its dequantized reference); the ``gpu`` tests check
the bf16 kernel path (``kdtree.experts``: its grouped GEMMs against float64 on empty, one-token,
chunk-boundary, odd and one-expert groups, the permutation's invariants, compute-sanitizer)
and the fp8 path (``torch._scaled_grouped_mm``) at Kimi K2's EP8 shard shapes, and their
graph capture.
"""
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
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_moe_at_kimi_ep8_shapes(fp8):
    """bf16 (torch._grouped_mm) and fp8 (torch._scaled_grouped_mm, per-row scales) against the
    float64 reference at the EP8 shard's shapes; the graph replay equals the eager call."""
    cfg = replace(get_config("kimi_k2_ep8"), expert_fp8=fp8)
    moe = moe_layer(cfg, "cuda", torch.bfloat16, seed=1)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(40, cfg.dim, device="cuda", generator=g).to(torch.bfloat16)
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
def test_permute_invariants():
    g = torch.Generator(device="cuda").manual_seed(3)
    T, k, E, El = 257, 8, 384, 48
    expert = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(T)])
    expert[:5] = torch.arange(8, device="cuda")              # all-local tokens
    expert[5] = torch.arange(100, 108, device="cuda")        # nothing local
    offs, rowidx, pos = ek.permute(expert, El)
    flat = expert.flatten().cpu()
    local = flat < El
    counts = torch.bincount(flat[local], minlength=El)
    assert torch.equal(offs.cpu().long(), counts.cumsum(0))
    p = pos.cpu().long()
    assert (p[~local] == -1).all() and torch.equal(p[local].sort().values, torch.arange(int(local.sum())))
    assert torch.equal(rowidx.cpu().long()[p[local]], torch.arange(T * k)[local] // k)
    ends = offs.cpu().long()
    starts = torch.cat((torch.zeros(1, dtype=torch.long), ends[:-1]))
    assert ((starts[flat[local]] <= p[local]) & (p[local] < ends[flat[local]])).all()  # inside its group
    assert (rowidx.cpu()[int(local.sum()):] == 0).all()


@pytest.mark.gpu
@torch.no_grad()
def test_kernel_path_matches_torch_path_and_captures():
    """The whole layer (router, kernels, shared expert added in the combine) against the torch
    path on the same weights at the EP8 shard's shapes, eager and in a graph."""
    moe = moe_layer(get_config("kimi_k2_ep8"), "cuda", torch.bfloat16, seed=2)
    x = torch.randn(65, moe.w1.shape[2], device="cuda").to(torch.bfloat16)
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


def test_kernel_entry_points_reject_bad_input():
    """Checked before anything launches (runs without a GPU: CPU tensors are refused first)."""
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    w = torch.zeros(2, 32, 256, dtype=torch.bfloat16)
    offs = torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="x: expected a bf16 CUDA tensor"):
        ek.grouped_gemm(x, w, offs, 4)
    with pytest.raises(TypeError, match="expert: expected an int64 CUDA tensor"):
        ek.permute(torch.zeros(3, 2, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="ys: expected contiguous float32"):
        ek.combine(torch.zeros(4, 6), torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2))
    assert not ek.supported(x, w, w, 2)                       # CPU tensors take the torch path
    assert [ek.chunk_tiles(T, 8, 384) for T in (1, 65, 257, 1025)] == [1, 1, 2, 4]
