"""CPU tests of the torch engine (float32): the model's math, the drafter, and the lossless loop."""
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_cases import random_case
from kdtree.attention import HEADS, reference_attention
from kdtree.engine import (MODEL_PRESETS, PAPER_MATH500_QWEN3_8B, PAPER_MATH500_QWEN3_8B_FIGURES, ModelConfig,
                           SyntheticDrafter, allocate_cache, build_model,
                           chain_tree, generate, get_config, get_drafter_config, latent_attention,
                           simulate_acceptance, tp_slice, visibility_mask)
from kdtree.engine.ddtree import DecodeState, _advance, run_phases, start
from kdtree.engine.model import MoE, SwiGLU, Transformer, rope
from kdtree.bench.engine_bench import _Breakdown, _take_rounds, self_consistent_run, step_breakdown, throughput_sweep
from kdtree.tree import Tree

NEW = 96
BATCHES = {"three": (5, 17, 11), "long": (70, 3), "four": (1, 40, 9, 2)}  # 70 > 64: a two-word prefill mask


@pytest.fixture(scope="module", autouse=True)
def _threads():
    """One intra-op thread: the tiny model's ops are too small to split, and on a loaded two-core
    runner OpenMP barriers made the suite ten times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model():
    return build_model(get_config("tiny"), seed=0)


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, get_config("tiny").vocab_size, (n,), generator=g) for n in lengths]


@pytest.fixture(scope="module")
def greedy(model):
    """The autoregressive reference output of each batch."""
    return {name: generate(model, _prompts(lens), NEW, mode="ar") for name, lens in BATCHES.items()}


def _drafter(reference, accuracy=0.8, seed=0, spread=0.5):
    d = SyntheticDrafter(get_drafter_config("tiny"), get_config("tiny").vocab_size, accuracy=accuracy,
                         spread=spread, seed=seed)
    d.set_reference(reference)
    return d


# ---- configs ----

def test_presets_valid():
    for name, cfg in MODEL_PRESETS.items():
        assert get_config(name) is cfg
        assert cfg.first_dense == 1 and cfg.n_active_experts <= cfg.n_routed_experts
    for name in ("kimi_k2_attn", "kimi_k2_tp8", "kimi_k2_tp4", "kimi_k2_tp2"):
        cfg = get_config(name)
        assert (cfg.kv_lora_rank, cfg.qk_rope_dim, cfg.latent_dim) == (512, 64, 576)  # the kernels' widths
        assert (cfg.qk_nope_dim, cfg.v_head_dim) == (128, 128) and cfg.n_heads in HEADS
    assert [get_config(f"kimi_k2_tp{t}").n_heads for t in (8, 4, 2)] == [8, 16, 32]
    assert get_config("kimi_k2_attn").n_heads == 64
    model = build_model(get_config("tiny"))
    assert isinstance(model.layers[0].ffn, SwiGLU) and all(isinstance(b.ffn, MoE) for b in model.layers[1:])


def test_kimi_k2_ep8_presets():
    """One GPU's share of Kimi K2 under TP8 attention and EP8 experts, and how many layers fit."""
    from kdtree.engine.config import fitting_layers, kimi_k2_shard, weight_bytes
    bf16, fp8 = get_config("kimi_k2_ep8"), get_config("kimi_k2_ep8_fp8")
    for cfg in (bf16, fp8):
        assert (cfg.n_heads, cfg.dim, cfg.moe_inter_dim, cfg.n_active_experts) == (8, 7168, 2048, 8)
        assert (cfg.n_routed_experts, cfg.n_local_experts, cfg.expert_parallel) == (384, 48, 8)
        assert (cfg.shared_dim, cfg.inter_dim, cfg.vocab_size, cfg.first_dense) == (256, 2304, 20480, 1)
        assert cfg.latent_dim == 576 and cfg.n_heads in HEADS
    expert = 3 * 2048 * 7168
    w, w8 = weight_bytes(bf16), weight_bytes(fp8)
    assert w["moe_layer"] - w8["moe_layer"] == 48 * (expert - 4 * (2 * 2048 + 7168))  # 1 byte + fp32 row scales
    room = 139 * 2**30 - 10e9 - w["embed_head"] - w["dense_layer"]
    assert bf16.n_layers == 1 + int(room // w["moe_layer"]) == 33 and fp8.n_layers == 61
    assert w["total"] <= 139 * 2**30 - 10e9 < weight_bytes(bf16, 34)["total"]
    assert fitting_layers(bf16, memory_bytes=80 * 2**30) < 33
    with pytest.raises(ValueError, match="gpus"):
        kimi_k2_shard(3)
    with pytest.raises(ValueError, match="expert_parallel"):
        replace(bf16, expert_parallel=5)


def test_config_errors_name_the_argument():
    base = get_config("tiny")
    with pytest.raises(ValueError, match="qk_rope_dim"):
        ModelConfig(**{**base.__dict__, "qk_rope_dim": 7})
    with pytest.raises(ValueError, match="n_active_experts"):
        ModelConfig(**{**base.__dict__, "n_active_experts": 9})
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig(**{**base.__dict__, "n_heads": 0})
    with pytest.raises(ValueError, match="tp"):
        tp_slice(get_config("kimi_k2_attn"), 3)
    with pytest.raises(ValueError, match="name"):
        get_config("kimi")
    with pytest.raises(ValueError, match="capacity"):
        allocate_cache(base, 2, 0)


# ---- model math ----

def test_chain_tree_matches_from_parents():
    lens = torch.tensor([70, 1, 65])
    tree = chain_tree(lens, 70)
    parents = torch.where(torch.arange(70) < lens[:, None], torch.arange(70) - 1, -1)
    ref = Tree.from_parents(parents)
    for field in ("parents", "depth", "num_nodes", "visibility"):
        assert torch.equal(getattr(tree, field), getattr(ref, field)), field


def test_latent_attention_matches_reference(gen):
    """The engine's float32 attention and mask equal kdtree's float64 reference, padding rows included."""
    q, kv, pl, tree = random_case(3, 70, 8, [0, 37, 130], gen, extra=3, num_nodes=[41, 70, 70])
    ref_out, _ = reference_attention(q, kv, pl, tree, 0.07)
    mask = visibility_mask(tree.visibility, pl, kv.shape[1])
    out = latent_attention(q.float(), kv.float(), mask, 0.07, 512)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=2e-5)
    assert not bool(mask[0, 41:].any())  # padding rows of an empty prefix see nothing: zeros out
    assert float(out[0, 41:].abs().max()) == 0.0


def _unabsorbed_logits(model, tokens):
    """A textbook causal MLA forward: per-head keys and values expanded from the latent."""
    cfg = model.cfg
    H, r, nope, rd, vd = cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
    T = tokens.shape[1]
    pos = torch.arange(T)[None]
    x = model.embed(tokens)
    for blk in model.layers:
        a, h = blk.attn, blk.attn_norm(x)
        qn, qr = a.wq_b(a.q_norm(a.wq_a(h))).view(1, T, H, nope + rd).split([nope, rd], -1)
        c, kr = a.wkv_a(h).split([r, rd], -1)
        kn, v = a.wkv_b(a.kv_norm(c)).view(1, T, H, nope + vd).split([nope, vd], -1)
        q = torch.cat((qn, rope(qr, pos, a.inv_freq)), -1)
        k = torch.cat((kn, rope(kr, pos, a.inv_freq)[:, :, None].expand(1, T, H, rd)), -1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=cfg.softmax_scale)
        x = x + a.wo(o.transpose(1, 2).reshape(1, T, H * vd))
        x = x + blk.ffn(blk.ffn_norm(x))
    return model.head(model.norm(x))


def test_absorbed_prefill_equals_unabsorbed_mla(model):
    tokens = _prompts([23])[0][None]
    cache = allocate_cache(model.cfg, 1, 32)
    logits = model(tokens, chain_tree(torch.tensor([23]), 23), cache)
    torch.testing.assert_close(logits, _unabsorbed_logits(model, tokens), atol=1e-4, rtol=1e-4)


def test_moe_matches_per_token_loop(model, gen):
    moe = model.layers[1].ffn
    x = torch.randn(2, 9, model.cfg.dim, generator=gen)
    flat = x.reshape(-1, model.cfg.dim)
    w, e = torch.sigmoid(moe.gate(flat)).topk(moe.k, dim=-1)
    w = w / w.sum(-1, keepdim=True) * moe.scale
    ref = torch.stack([sum(w[t, s] * (F.silu(flat[t] @ moe.w1[e[t, s]].T) * (flat[t] @ moe.w3[e[t, s]].T))
                           @ moe.w2[e[t, s]].T for s in range(moe.k)) for t in range(flat.shape[0])])
    ref = ref + moe.shared(flat)
    torch.testing.assert_close(moe(x), ref.view_as(x), atol=1e-5, rtol=1e-5)


def test_router_is_float32_in_every_dtype(gen):
    """In a bf16 model the MoE gate weight stays float32, drawn from the seed, and the routing
    scores are computed from x in float32 (a bf16 gate matmul flips near-tied experts between
    computation paths)."""
    cfg = get_config("tiny")
    model = build_model(cfg, seed=3, dtype=torch.bfloat16)
    again = build_model(cfg, seed=3, dtype=torch.bfloat16)
    for name, p in model.named_parameters():
        assert p.dtype == (torch.float32 if name.endswith("ffn.gate.weight") else torch.bfloat16), name
        assert torch.equal(p, again.get_parameter(name)), name  # the seed fixes every weight
    moe = model.layers[1].ffn
    assert float(moe.gate.weight.std()) == pytest.approx(cfg.dim ** -0.5, rel=0.2)  # initialised, N(0, 1/fan_in)
    x = torch.randn(7, cfg.dim, generator=gen).to(torch.bfloat16)
    scores = moe.scores(x)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, torch.sigmoid(x.double() @ moe.gate.weight.double().T).float(),
                               atol=1e-6, rtol=1e-6)
    y = moe(x[None])
    assert y.dtype == torch.bfloat16 and y.shape == (1, 7, cfg.dim) and bool(y.isfinite().all())


# ---- the loop ----

@pytest.mark.parametrize("budget", [1, 4, 16, 64, 256])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_ddtree_is_lossless(model, greedy, batch, budget):
    ref = greedy[batch]
    out = generate(model, _prompts(BATCHES[batch]), NEW, mode="ddtree", drafter=_drafter(ref.tokens),
                   budget=budget)
    assert out.tokens.shape == (len(BATCHES[batch]), NEW)
    assert torch.equal(out.tokens, ref.tokens)
    emitted = out.accepted.sum(0)  # every sequence emitted enough, and stopped within one step of it
    assert bool((emitted >= NEW - 1).all()) and bool((emitted - out.accepted.max(0).values < NEW - 1).all())
    assert out.steps < ref.steps if budget > 1 else out.mean_accepted <= 2.0
    if budget >= 4:
        assert out.mean_accepted > 1.5


def test_compacted_cache_equals_greedy_cache(model, greedy):
    """After DDTree steps, every layer's committed latent rows are the rows greedy decoding wrote."""
    prompts = _prompts(BATCHES["three"])
    states = []
    for mode in ("ar", "ddtree"):
        state, phases = start(model, prompts, 40, mode, _drafter(greedy["three"].tokens), budget=16)
        while int(state.n_out.min()) < 40:
            run_phases(phases)
        states.append(state)
    ar, dd = states
    for b, p in enumerate(prompts):
        n = p.numel() + 39  # the prompt and the first 39 new tokens are committed in both
        assert int(dd.cache.lengths[b]) >= n
        torch.testing.assert_close(dd.cache.kv[:, b, :n], ar.cache.kv[:, b, :n], atol=1e-5, rtol=1e-5)


def test_lossless_at_kimi_attention_shapes():
    """The same exactness with Kimi K2's per-GPU attention (8 heads, latent 512 + 64, nope and value
    128) at a small hidden width, so the float32 path runs the kernels' 576-wide rows."""
    cfg = replace(get_config("kimi_k2_tp8"), n_layers=2, dim=128, q_lora_rank=64, inter_dim=128,
                  moe_inter_dim=32, vocab_size=512)
    model = build_model(cfg, seed=1)
    prompts = [p % 512 for p in _prompts((12, 33))]
    textbook = _unabsorbed_logits(model, prompts[1][None])
    cache = allocate_cache(cfg, 1, 40)
    torch.testing.assert_close(model(prompts[1][None], chain_tree(torch.tensor([33]), 33), cache), textbook,
                               atol=1e-4, rtol=1e-4)
    ref = generate(model, prompts, 48)
    drafter = SyntheticDrafter(get_drafter_config("tiny"), 512, accuracy=0.85)
    drafter.set_reference(ref.tokens)
    out = generate(model, prompts, 48, mode="ddtree", drafter=drafter, budget=32)
    assert torch.equal(out.tokens, ref.tokens) and out.mean_accepted > 2.0


def test_chain_drafter_is_lossless(model, greedy):
    ref = greedy["three"]
    out = generate(model, _prompts(BATCHES["three"]), NEW, mode="ddtree", drafter=_drafter(ref.tokens),
                   budget=15, topk=1)
    assert torch.equal(out.tokens, ref.tokens)


def test_acceptance_rises_with_budget_and_accuracy(model, greedy):
    ref = greedy["three"]
    prompts = _prompts(BATCHES["three"])

    def tau(budget, accuracy):
        return generate(model, prompts, NEW, mode="ddtree", drafter=_drafter(ref.tokens, accuracy),
                        budget=budget).mean_accepted

    assert tau(64, 0.9) > tau(4, 0.9) > tau(1, 0.9)
    assert tau(16, 0.95) > tau(16, 0.5)
    assert tau(64, 0.9) > 4.0


def test_drafter_is_calibrated(gen):
    """The true token is the drafter's top choice with probability ``accuracy``."""
    B, V, acc = 64, get_config("tiny").vocab_size, 0.7
    d = _drafter(torch.randint(0, V, (B, 200), generator=gen), accuracy=acc, seed=int(torch.randint(0, 2**31, (1,), generator=gen)))
    hits = []
    for g in (1, 40, 90, 150):
        generated = torch.full((B,), g)
        top = d.draft(torch.zeros(B, dtype=torch.long), generated, generated).argmax(-1)
        j = g - 1 + torch.arange(1, d.draft_len + 1)
        hits.append(top == d.reference[:, j])
    rate = float(torch.cat(hits).float().mean())
    assert abs(rate - acc) < 0.04, rate  # 3840 draws: 4.5 standard errors


def test_simulated_acceptance_equals_the_engine(model):
    """simulate_acceptance replays the loop without the target: the same per-step acceptance."""
    prompts = _prompts(BATCHES["three"])
    drafter = _drafter(generate(model, prompts, NEW + 16, mode="ar").tokens)  # covers the last drafts
    for budget in (4, 64):
        out = generate(model, prompts, NEW, mode="ddtree", drafter=drafter, budget=budget)
        assert torch.equal(simulate_acceptance(drafter, budget, NEW), out.accepted)


@pytest.mark.parametrize("budget,topk,tau", [(15, 1, PAPER_MATH500_QWEN3_8B_FIGURES["tau_chain"]),
                                             (512, None, PAPER_MATH500_QWEN3_8B_FIGURES["tau_ddtree_512"])])
def test_paper_calibration(gen, budget, topk, tau):
    """The calibrated drafter reproduces the paper's chain (DFlash) and budget-512 acceptance."""
    ref = torch.randint(0, 256, (24, 500), generator=gen)
    drafter = _drafter(ref, seed=int(torch.randint(0, 2**31, (1,), generator=gen)), **PAPER_MATH500_QWEN3_8B)
    acc = simulate_acceptance(drafter, budget, 480, topk)
    assert float(acc[acc > 0].float().mean()) == pytest.approx(tau, abs=0.5)  # ~3.5 standard errors


def test_device_side_of_the_step_never_reads_values():
    """The model forward, the drafter and the commit run on meta tensors, which have no values:
    any host read (``int()``, ``.item()``, a data-dependent shape) would raise. On CUDA that is
    what lets the step be captured in one graph (the kdtree ops run with ``validate=False``)."""
    B, N, cfg = 2, 17, get_config("tiny")
    with torch.device("meta"):
        model = Transformer(cfg).eval()
    drafter = _drafter(torch.zeros(B, 100, dtype=torch.long)).to("meta")
    drafter.set_reference(torch.zeros(B, 100, dtype=torch.long, device="meta"))
    cache = allocate_cache(cfg, B, 64, "meta")
    ones = torch.ones(B, dtype=torch.long, device="meta")
    with torch.no_grad():
        logits = model(torch.zeros(B, N, dtype=torch.long, device="meta"), chain_tree(ones * N, N), cache)
        draft = drafter.draft(ones, cache.lengths, ones)
        state = DecodeState(cache, ones.clone(), torch.zeros(B, 40, dtype=torch.long, device="meta"), ones.clone(),
                            torch.zeros(8, B, dtype=torch.long, device="meta"),
                            torch.zeros(1, dtype=torch.long, device="meta"), chain_tree(ones, 1), 8)
        _advance(state, logits.argmax(-1)[:, :16], ones * 3, ones)
    assert logits.shape == (B, N, cfg.vocab_size) and draft.shape == (B, drafter.draft_len, cfg.vocab_size)


def test_bad_input_names_the_argument(model, greedy):
    prompts = _prompts([4, 6])
    d = _drafter(greedy["three"].tokens)
    cases = [
        (dict(prompts=[]), "prompts"),
        (dict(prompts=[torch.rand(4)]), r"prompts\[0\]"),
        (dict(prompts=[torch.tensor([1, 256])]), r"prompts\[0\]"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(mode="beam"), "mode"),
        (dict(mode="ddtree"), "drafter"),
        (dict(mode="ddtree", drafter=d, budget=0), "budget"),
        (dict(mode="ddtree", drafter=d, budget="4"), "budget"),
        (dict(mode="ddtree", drafter=d, budget=4, topk=257), "topk"),
        (dict(cuda_graph=True), "cuda_graph"),
        (dict(warmup=-1), "warmup"),
    ]
    for kwargs, name in cases:
        args = dict(prompts=prompts, max_new_tokens=8) | kwargs
        with pytest.raises(ValueError, match=name):
            generate(model, **args)
    with pytest.raises(TypeError, match="model"):
        generate(torch.nn.Linear(2, 2), prompts, 8)
    with pytest.raises(ValueError, match="root"):  # the reference has 3 rows, the batch 2
        generate(model, prompts, 8, mode="ddtree", drafter=d, budget=4)
    with pytest.raises(ValueError, match="accuracy"):
        SyntheticDrafter(get_drafter_config("tiny"), 256, accuracy=1.0)
    with pytest.raises(ValueError, match="tokens"):
        d.set_reference(torch.rand(2, 5))


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_step_breakdown_rows(model, greedy, mode):
    drafter = _drafter(greedy["three"].tokens) if mode == "ddtree" else None
    rows = step_breakdown(model, _prompts(BATCHES["three"]), mode=mode, drafter=drafter, budget=16, steps=4,
                          warmup=1)
    by = {r["phase"]: r for r in rows}
    phases = ["verify", "commit"] if mode == "ar" else ["draft", "topk", "build", "verify", "accept", "compact",
                                                        "commit"]
    assert set(by) == set(phases) | {"step", "host", "verify.attention", "verify.rest"}
    assert all(by[p]["median_us"] > 0 and by[p]["p20_us"] <= by[p]["median_us"] <= by[p]["p80_us"] for p in phases)
    assert by["verify.attention"]["median_us"] > 0
    assert sum(by[p]["median_us"] for p in phases) == pytest.approx(by["step"]["median_us"], rel=0.5)
    with pytest.raises(ValueError, match="timing"):
        step_breakdown(model, _prompts([3]), mode="ar", timing="graph")


def test_breakdown_rounds_alternate_and_report_the_quietest(model, greedy):
    """Rounds of two breakdowns alternate (round 0 of each, then round 1, ...), and each reports
    every phase from its own round with the lowest median step, not a phase-wise minimum; the
    host time from the host's quietest round."""
    prompts = _prompts(BATCHES["three"])
    runs = [_Breakdown(model, prompts, "ar", None, 1, None, 3, 1, "eager", 128, None),
            _Breakdown(model, prompts, "ddtree", _drafter(greedy["three"].tokens), 16, None, 3, 1, "eager", 128, None)]
    order = []

    def recording(r, index):
        return lambda: (order.append(index), type(r).round(r))

    for i, run in enumerate(runs):
        run.round = recording(run, i)
    _take_rounds(runs, 3)
    assert order == [0, 1, 0, 1, 0, 1] and all(len(r.rounds) == 3 for r in runs)
    run = runs[1]
    # make round 1 the quietest by its step time while another round holds the smallest commit
    for i, scale in enumerate((2.0, 0.5, 3.0)):
        run.rounds[i] = {k: [t * scale for t in v] for k, v in run.rounds[i].items()}
    run.rounds[2]["commit"] = [1e-9] * 3
    run.rounds[0]["host"] = [1e-9] * 3   # the host row: from the host's own quietest round
    by = {r["phase"]: r for r in run.rows()}
    quiet = run.rounds[1]
    for phase in ("step", "commit", "verify", "verify.attention"):
        assert by[phase]["median_us"] == pytest.approx(float(np.median(quiet[phase])) * 1e6)
    assert by["host"]["median_us"] == pytest.approx(1e-3)
    for bad in (0, 2.0):
        with pytest.raises(ValueError, match="rounds"):
            step_breakdown(model, prompts, mode="ar", rounds=bad)


def test_throughput_sweep_rows(model, greedy):
    drafter = _drafter(torch.zeros(1, 1, dtype=torch.long))  # the sweep sets the reference
    refs = {}
    rows = throughput_sweep(model, _prompts(BATCHES["three"]), 32, drafter, budgets=(1, 16), references=refs)
    assert [(r["mode"], r["budget"]) for r in rows] == [("ar", 0), ("chain", 15), ("ddtree", 1), ("ddtree", 16)]
    assert all(r["lossless"] and r["tokens_per_s"] > 0 for r in rows)
    # float32: every run reproduces greedy decoding, so the first round's reference (greedy's) stands
    assert all(r["agree_ar"] == 1.0 and r["first_divergence"] == -1 and r["self_consistent"] for r in rows)
    assert [r["reference_rounds"] for r in rows] == [0, 1, 1, 1]
    assert sorted(refs) == [("chain", 15, False), ("ddtree", 1, False), ("ddtree", 16, False)]
    assert all(torch.equal(ref, greedy["three"].tokens[:, :32 + drafter.draft_len]) for ref in refs.values())
    by = {(r["mode"], r["budget"]): r for r in rows}
    assert by[("ar", 0)]["tau"] == 1.0 and by[("ar", 0)]["speedup"] == 1.0
    assert by[("ddtree", 16)]["tau"] > by[("ddtree", 1)]["tau"] > 1.0


def test_self_consistent_run_adopts_the_decoded_path(model, greedy):
    """A reference that parts from what DDTree decodes (here: greedy output with two tokens
    changed, as a bf16 rounding tie would make it) is replaced by the run's own output, which
    then agrees; the drafter then drafts the decoded path again, so the acceptance recovers."""
    prompts, new = _prompts(BATCHES["three"]), 48
    truth = greedy["three"].tokens[:, :new + 15]
    wrong = truth.clone()
    wrong[0, 5] = (wrong[0, 5] + 1) % 256
    wrong[2, 30] = (wrong[2, 30] + 1) % 256
    drafter = _drafter(wrong, accuracy=0.9)
    out, ref, rounds = self_consistent_run(model, prompts, new, drafter, wrong, budget=16)
    assert rounds == 2 and torch.equal(ref, truth) and torch.equal(drafter.reference, truth)
    assert torch.equal(out.tokens, truth[:, :new])
    capped, ref1, rounds1 = self_consistent_run(model, prompts, new, drafter, wrong, budget=16, max_rounds=1)
    assert rounds1 == 1 and torch.equal(ref1, wrong)
    assert torch.equal(capped.tokens, truth[:, :new])  # lossless whatever the drafter says
    assert not torch.equal(capped.tokens, ref1[:, :new])  # ... but not self-consistent
    assert out.mean_accepted > capped.mean_accepted
    with pytest.raises(ValueError, match="max_rounds"):
        self_consistent_run(model, prompts, new, drafter, wrong, budget=16, max_rounds=0)
    with pytest.raises(ValueError, match="reference"):
        self_consistent_run(model, prompts, new, drafter, wrong[:, :10], budget=16)
