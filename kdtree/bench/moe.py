"""The MoE layer of a verify forward: time against tree tokens, distinct experts, bytes, roofline.

A verify forward pushes T = batch x (budget + 1) tokens through every MoE layer. On one GPU of
an expert-parallel deployment (``kimi_k2_ep8``: 48 of Kimi K2's 384 experts, top-8) a decode
token touches about one local expert, but T tree tokens touch about
``E_local (1 - (1 - k / E)^T)`` of them under uniform routing (``kdtree.experts.expected_distinct``): the
expert weights streamed per layer grow up to E_local-fold, and at small batch the MoE is a
memory-bound stream of expert weights. This module measures the engine's own MoE module
(``kdtree.engine.model.MoE``: float32 router, permutation, grouped GEMMs, weighted combine,
shared expert; on a GPU the bf16 layer runs as ``kdtree.experts``' five kernels, the torch
path with ``torch._grouped_mm`` or, for fp8 experts, ``torch._scaled_grouped_mm`` is timed
beside it) under graph replay, for three routings:

* ``model``: the layer's router on random activations;
* ``uniform``: every token's k experts a uniform random k-subset of the E global experts;
* ``zipf``: experts drawn without replacement with probability proportional to
  ``1 / rank^zipf_a`` (popularity ranks a seeded random permutation of the experts).

For the synthetic routings the router still runs (its time counts) and its choice is replaced.
Each point is checked against a float64 per-slot reference first, then timed; the byte model
(``moe_layer_cost``) counts the distinct local experts' weights (the algorithmic minimum, what
HBM must deliver) and the activation traffic of the code path the layer took (the torch path's
static-shape permutation gathers, gates and combines every one of the T x k slots, local or
not; the kernels touch the local slots and the shared rows only), and ``kdtree.bench.roofline``
says which roof binds.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import torch

from kdtree.bench.ceilings import Ceilings
from kdtree.bench.models import Cost, Launch
from kdtree.bench.roofline import classify_point
from kdtree.bench.timing import time_graph, time_host
from kdtree.engine.config import ModelConfig, get_config
from kdtree.engine.model import FP8, MoE, build_model, grouped_linear, quantize_rows
from kdtree import experts as ek
from kdtree.experts import ROUTER_KERNEL, ROUTER_SLICES, expected_distinct

ROUTINGS = ("model", "uniform", "zipf")
TOKENS = (1, 17, 65, 257, 1025)


def moe_layer_cost(*, tokens: int, distinct: int, local_slots: int, dim: int, inter: int, shared_inter: int,
                   experts: int, k: int, weight_bytes: int = 2, act_bytes: int = 2, router_kernel: bool = False,
                   expert_kernels: bool = False, router_permutes: bool = False) -> Cost:
    """FLOPs and bytes of one MoE layer call on one GPU (router, routed experts, shared expert).

    Parameters
    ----------
    tokens : int
        T, tokens through the layer.
    distinct : int
        Distinct local experts the call touches: their weights are read once each.
    local_slots : int
        (token, slot) pairs routed to this GPU's experts: the grouped GEMMs' rows.
    dim, inter, shared_inter : int
        Hidden width, expert intermediate, shared-expert intermediate on this GPU (0: none).
    experts, k : int
        Global routed experts (the float32 router's rows) and experts per token.
    weight_bytes : int
        Bytes per expert weight: 2 for bf16, 1 for fp8 (plus a float32 scale per output row),
        4 for the float32 CPU path.
    act_bytes : int
        Bytes per activation value (2 for bf16, 4 for the float32 CPU path).
    router_kernel : bool
        The router runs as ``kdtree.experts.route`` (one launch: it writes the T x E float32
        scores, on the default mma kernel one plane of them per K slice, and its last blocks read
        them back for the top-k), else as torch ops.
    expert_kernels : bool
        The experts run as ``kdtree.experts.routed_experts`` (bf16): a permutation kernel, the
        gate/up and the down grouped GEMM over the local slots and the shared expert's T rows
        (an extra group of each), and the combine, which reads each token's local rows and
        shared row (float32) and writes the output. Else the torch path of ``MoE.experts``: the
        static-shape permutation gathers, gates, weights, un-permutes and sums all T x k slots,
        local or not, and the shared expert runs as its own SwiGLU.
    router_permutes : bool
        With both kernels: the router's one finaliser also groups the slots by expert
        (``kdtree.experts.route_permuted`` at few tokens), so no permutation launch follows.

    Returns
    -------
    Cost
        ``bytes_min``: the touched experts' weights (and fp8 scales), the shared expert, the
        float32 router and the layer's input and output, each once. Intermediates written and
        read again by a later launch are ``carried``; the grouped GEMMs read each touched
        expert once and run only the local rows (and, on the kernel path, the shared rows).
        Launch counts are per op of the code path (the run's kernel count is in the bench's
        ``kernels`` column).
    """
    for name, v in (("tokens", tokens), ("distinct", distinct), ("local_slots", local_slots), ("dim", dim),
                    ("inter", inter), ("shared_inter", shared_inter), ("experts", experts), ("k", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    if local_slots > tokens * k:
        raise ValueError(f"local_slots: {local_slots} exceeds tokens * k = {tokens * k}")
    if weight_bytes not in (1, 2, 4):
        raise ValueError(f"weight_bytes: expected 1 (fp8), 2 (bf16) or 4 (float32), got {weight_bytes!r}")
    if expert_kernels and (weight_bytes != 2 or act_bytes != 2):
        raise ValueError("expert_kernels: the kernel path runs bf16 experts and activations only")
    if router_permutes and not (router_kernel and expert_kernels):
        raise ValueError("router_permutes: only with router_kernel and expert_kernels")
    fp8, b, T, R, Rl = weight_bytes == 1, act_bytes, tokens, tokens * k, local_slots
    scales = 4 * (2 * inter + dim) if fp8 else 0
    w13 = distinct * (2 * inter * dim * weight_bytes + 4 * 2 * inter * fp8)
    w2 = distinct * (inter * dim * weight_bytes + 4 * dim * fp8)
    shared = 3 * dim * shared_inter * b
    bytes_min = distinct * (3 * inter * dim * weight_bytes + scales) + shared + experts * dim * 4 + 2 * T * dim * b

    def launch(name, flops, read, write, carried=0.0, count=1):
        return Launch(name, float(flops), float(read), float(write), float(read), float(write), float(carried), count)

    gate_flops = 2 * T * experts * dim
    if router_kernel:   # the mma router's K slices each write a float32 T x E partial plane, summed in order
        planes = (ROUTER_SLICES if ROUTER_KERNEL == "mma" else 1) * T * experts * 4
        perm = 2 * R * 4 if router_permutes else 0           # pos and rowidx, written by its finaliser
        parts = [launch("moe_router: float32 gate, sigmoid, top-k, renormalise"
                        + (", group the slots by expert" if router_permutes else ""), gate_flops,
                        experts * dim * 4 + T * dim * b + planes, planes + R * 12 + perm, planes)]
    else:
        parts = [launch("router: float32 gate, sigmoid, top-k, renormalise", gate_flops,
                        experts * dim * 4 + T * dim * b, R * 12, count=6)]
    if expert_kernels:
        S = T if shared_inter else 0                          # the shared expert's rows
        xin, hin = (Rl + S) * dim * b, (Rl * inter + S * shared_inter) * b
        if not router_permutes:
            parts.append(launch("moe_permute: group ends, positions, tokens", 0, R * 8, 2 * R * 4, R * 8))
        parts += [launch("moe_grouped_gemm: gate and up (routed and shared), SiLU product",
                         2 * 2 * (Rl * inter + S * shared_inter) * dim,
                         w13 + 2 * shared_inter * dim * b + xin + Rl * 4, hin, Rl * 4),
                  launch("moe_grouped_gemm: down (routed and shared), float32 out",
                         2 * (Rl * inter + S * shared_inter) * dim, w2 + shared_inter * dim * b + hin,
                         (Rl + S) * dim * 4, hin),
                  launch("moe_combine: weighted slot sum plus the shared row", 0, (Rl + S) * dim * 4 + R * 8,
                         T * dim * b, (Rl + S) * dim * 4 + R * 8)]
    else:
        parts.append(launch("permute: sort slots by expert, offsets, gather rows", 0, T * dim * b + R * 24,
                            R * dim * b, count=10))
        if fp8:
            parts.append(launch("quantize activations per row (gate/up and down inputs)", 0,
                                R * (dim + inter) * b, R * (dim + inter + 8), R * (dim + inter) * b, count=8))
        xin = Rl * dim * (1 if fp8 else b)
        hin = Rl * inter * (1 if fp8 else b)
        parts += [launch("grouped GEMMs: gate and up projections", 2 * 2 * Rl * inter * dim, w13 + 2 * xin,
                         2 * Rl * inter * b, 2 * xin, count=2),
                  launch("SiLU and multiply over all slots", 0, 3 * R * inter * b, 2 * R * inter * b,
                         3 * R * inter * b, count=2),
                  launch("grouped GEMM: down projection", 2 * Rl * inter * dim, w2 + hin, Rl * dim * b, hin),
                  launch("weight, mask, un-permute, sum the slots", 0, 5 * R * dim * b + R * 9,
                         3 * R * dim * b + T * dim * b, 5 * R * dim * b, count=6)]
        if shared_inter:
            parts.append(launch("shared expert (dense SwiGLU) and the residual add", 2 * 3 * T * shared_inter * dim,
                                shared + T * dim * b * 3 + 3 * T * shared_inter * b, T * dim * b * 2
                                + 3 * T * shared_inter * b, 3 * T * shared_inter * b + T * dim * b, count=6))
    note = (f"{distinct} distinct local experts ({ {1: 'fp8', 2: 'bf16', 4: 'float32'}[weight_bytes]}) for {T} tokens, "
            f"{Rl} local slots of {R}; router {'kernel' if router_kernel else 'torch'}, experts "
            f"{'kernels' if expert_kernels else 'torch'}")
    return Cost(2.0 * (3 * Rl * inter * dim + 3 * T * shared_inter * dim + T * experts * dim), float(bytes_min),
                "tensor", tuple(parts), note)


def routing_ids(kind: str, tokens: int, experts: int, k: int, *, zipf_a: float = 1.2,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Synthetic expert ids [tokens, k] (int64, distinct within a row) for ``uniform`` or ``zipf``.

    ``zipf``: expert of popularity rank r (1-based) has weight ``r ** -zipf_a``; ranks are a
    random permutation of the experts; k experts per token drawn without replacement (Gumbel
    top-k). ``zipf_a = 0`` is uniform.
    """
    if kind not in ("uniform", "zipf"):
        raise ValueError(f"kind: expected 'uniform' or 'zipf', got {kind!r}")
    if not (isinstance(zipf_a, (int, float)) and math.isfinite(zipf_a) and zipf_a >= 0):
        raise ValueError(f"zipf_a: expected a finite number >= 0, got {zipf_a!r}")
    if not 1 <= k <= experts:
        raise ValueError(f"k: expected 1..experts={experts}, got {k}")
    g = generator or torch.Generator().manual_seed(0)
    logw = torch.zeros(experts, dtype=torch.float64)
    if kind == "zipf":
        rank = torch.randperm(experts, generator=g).double() + 1.0
        logw = -zipf_a * rank.log()
    u = torch.rand(tokens, experts, generator=g, dtype=torch.float64).clamp(1e-300, 1.0)
    return (logw - (-u.log()).log()).topk(k, dim=-1).indices


def moe_reference(moe: MoE, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """``moe.experts`` in float64, one (token, slot) at a time: the local slots' weighted sum [T, dim].

    Products and sums run in float64; the intermediates are rounded to x's dtype where the
    module's path stores them (the gate and up outputs, SiLU, their product), so that for fp8
    experts the down projection's input is quantized from the same values the fp8 path
    quantizes. For fp8 experts the weights are dequantized and the activations quantized per
    row as ``grouped_linear`` does, so the GEMMs' accumulation is what differs.
    """
    E = moe.w1.shape[0]

    def rnd(v):
        return v.to(x.dtype).double()

    def lin(v, name, e):
        w = getattr(moe, name)[e].double()
        if moe.fp8:
            q, s = quantize_rows(v[None].to(x.dtype).float())
            w = w * getattr(moe, f"{name}_scale")[e].double()[:, None]
            v = q[0].double() * s.double()
        return w @ v

    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        xt = x[t].double()
        for s in range(expert.shape[1]):
            e = int(expert[t, s])
            if e < E:
                h = rnd(rnd(torch.nn.functional.silu(rnd(lin(xt, "w1", e)))) * rnd(lin(xt, "w3", e)))
                out[t] += float(weight[t, s]) * lin(h, "w2", e)
    return out


def moe_layer(cfg: ModelConfig, device, dtype: torch.dtype, seed: int = 0) -> MoE:
    """One MoE layer of ``cfg`` with the engine's weights (a two-layer model's second layer)."""
    model = build_model(replace(cfg, n_layers=2, first_dense=1, vocab_size=256), seed=seed, device=device,
                        dtype=dtype)
    return model.layers[1].ffn


# Largest error of the MoE output against ``moe_reference``, relative to the output's largest
# magnitude. bf16: a few bf16 roundings (2^-8 each) of the stored intermediates. fp8: the
# reference quantizes the same formulas, but the down projection's input comes out of bf16
# GEMMs whose accumulation order differs from the float64 reference's, so its elements differ
# by a bf16 step (2^-8 relative) here and there. Where that moves a row's largest magnitude,
# the row's e4m3 scale moves and every element of the row is rounded again: e4m3 keeps 3
# mantissa bits, so each lands up to half a step (2^-5 .. 2^-4 relative) from its other
# rounding, independently along the expert intermediate (2048 for Kimi K2). A sum of 2048 such
# errors is a few percent of the output's largest magnitude: 2.6-2.8% for one bf16 step of the
# row maximum on N(0, 1) rows (test_fp8_tolerance_covers_one_requantization), 2.09% seen on an
# H200 (zipf routing, T = 1025). The bound is 2^-4, one e4m3 half-step of the largest output.
TOLERANCE = {False: 0.02, True: 2.0 ** -4}


def _check(moe: MoE, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> float:
    """Largest error of ``moe.experts`` against ``moe_reference`` relative to the output's scale;
    raises above ``TOLERANCE`` of the experts' format."""
    got = moe.experts(x, weight, expert).double()
    ref = moe_reference(moe, x, weight, expert)
    err = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    if not err <= TOLERANCE[moe.fp8]:
        raise AssertionError(f"MoE experts differ from the float64 reference: relative error {err:.3g}")
    return err


def count_kernels(fn) -> int:
    """CUDA kernels (and memset/memcpy operations) one call of ``fn`` runs, by the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def run_moe_bench(preset: str = "kimi_k2_ep8", tokens=TOKENS, routings=ROUTINGS, *, zipf_a: float = 1.2,
                  fp8: bool | None = None, ceilings: Ceilings | None = None, quick: bool = True,
                  seed: int = 0) -> pd.DataFrame:
    """MoE layer time against tokens for each routing, with distinct experts, bytes and roofline.

    Parameters
    ----------
    preset : str
        Model preset; its MoE layer is built with the engine's weights (bf16 on CUDA, float32
        on CPU, where ``fp8`` rows use the dequantized reference path).
    tokens : iterable of int
        T, tokens per call (verify: batch x (budget + 1)).
    routings : iterable of str
        Among ``ROUTINGS``.
    zipf_a : float
        Exponent of the ``zipf`` routing.
    fp8 : bool, optional
        Also time the layer with fp8 experts; default: on CUDA only. On CUDA the bf16 layer
        is timed twice: on the kernel path and on the torch path (``MoE.backend``).
    ceilings : Ceilings, optional
        Adds the roofline columns (``classify_point``) when given.
    quick : bool
        Fewer repetitions.

    Returns
    -------
    DataFrame
        One row per (variant, routing, tokens): kernel ``moe_layer``, variant (``bf16``: the
        ``kdtree.experts`` kernels; ``bf16-torch``: the torch path, the baseline timed beside
        them; ``fp8``: torch's scaled grouped GEMM; float32 / fp8-ref on CPU), routing, zipf_a, tokens, distinct (local experts touched),
        distinct_uniform (``expected_distinct``), local_experts, local_slots, check_error
        (against ``moe_reference`` on the first 5 tokens), error (why a point that failed its
        check or raised was not timed; empty otherwise), gemm_us (the three grouped GEMMs
        alone, ``MoE.expert_mlp`` on the permuted rows) and, with ceilings,
        gemm_hbm_fraction (the touched experts' bytes over that time), kernels (CUDA kernels per call, profiled once per variant; -1 on CPU), timing columns,
        and the roofline columns plus ``hbm_fraction`` (the minimum bytes, i.e. the distinct
        experts' weights, over the time, as a fraction of the measured HBM bandwidth).
    """
    bad = [r for r in routings if r not in ROUTINGS]
    if bad:
        raise ValueError(f"routings: unknown {bad}; expected among {ROUTINGS}")
    tokens = [int(t) for t in tokens]
    if not tokens or min(tokens) < 1:
        raise ValueError(f"tokens: expected positive ints, got {tokens}")
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cfg = get_config(preset)
    variants = [(False, "auto")] + ([(False, "torch")] if cuda else []) \
        + ([(True, "auto")] if (cuda if fp8 is None else fp8) else [])
    gen, bytes_per = torch.Generator().manual_seed(seed), torch.finfo(dtype).bits // 8
    rows, layers = [], {}
    for use_fp8, backend in variants:
        if use_fp8 not in layers:
            layers.clear()  # one layer in memory at a time
            layers[use_fp8] = moe_layer(replace(cfg, expert_fp8=use_fp8), device, dtype, seed)
        moe = layers[use_fp8]
        moe.backend = backend
        name = ("fp8" if use_fp8 else "bf16" + ("-torch" if backend == "torch" else "")) if cuda \
            else ("fp8-ref" if use_fp8 else "float32")
        E, El, k = cfg.n_routed_experts, cfg.n_local_experts, cfg.n_active_experts
        for routing in routings:
            for T in tokens:
                x = torch.randn(T, cfg.dim, generator=gen).to(device, dtype)
                weight, expert = moe.route(x)
                if routing != "model":
                    expert = routing_ids(routing, T, E, k, zipf_a=zipf_a, generator=gen).to(device)
                local = expert < El
                row = dict(kernel="moe_layer", variant=name, preset=preset, routing=routing,
                           zipf_a=zipf_a if routing == "zipf" else float("nan"), tokens=T,
                           distinct=int(expert[local].unique().numel()),
                           distinct_uniform=expected_distinct(T, k, E, El), local_experts=El,
                           local_slots=int(local.sum()), error="")
                try:
                    row["check_error"] = _check(moe, x[:5], weight[:5], expert[:5])
                except (RuntimeError, AssertionError) as exc:  # recorded per point; the run goes on
                    rows.append(row | {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
                    continue

                def call(x=x, expert=expert, moe=moe, routing=routing):
                    if routing == "model":
                        return moe(x)     # the layer as the model runs it (at few tokens one launch routes and permutes)
                    w, _ = moe.route(x)                       # the router runs; its choice is replaced
                    return moe.experts(x, w, expert, shared=True, after_router=True)

                t = (time_graph(call, reps=10 if quick else 30, calls_per_graph=3 if quick else 10)
                     if cuda else time_host(call, reps=3 if quick else 10, warmup=1))
                kernels = count_kernels(call) if cuda else -1
                order, _, offs = moe.permute(expert)
                xs = x[order // k]
                g = (time_graph(lambda xs=xs, offs=offs, moe=moe: moe.expert_mlp(xs, offs), reps=10 if quick else 30,
                                calls_per_graph=3 if quick else 10)
                     if cuda else time_host(lambda xs=xs, offs=offs, moe=moe: moe.expert_mlp(xs, offs), reps=3 if quick else 10, warmup=1))
                row |= dict(kernels=kernels, gemm_us=g.median_us, **t.as_dict())
                if ceilings is not None:
                    cost = moe_layer_cost(tokens=T, distinct=row["distinct"], local_slots=row["local_slots"],
                                          dim=cfg.dim, inter=cfg.moe_inter_dim, shared_inter=cfg.shared_dim,
                                          experts=E, k=k, weight_bytes=1 if use_fp8 else bytes_per,
                                          act_bytes=bytes_per, router_kernel=moe.use_router_kernel(x),
                                          expert_kernels=moe.use_kernels(x),
                                          router_permutes=(routing == "model" and moe.use_kernels(x)
                                                           and moe.use_router_kernel(x) and ek.router_permutes(T)))
                    row |= classify_point(cost, ceilings, t.median_us, t.mode, t.l2, name, "moe_layer")
                    row["hbm_fraction"] = row["achieved_tbs"] * 1e12 / ceilings.hbm_bw
                    experts_bytes = cost.bytes_min - 2 * T * cfg.dim * bytes_per - E * cfg.dim * 4 \
                        - 3 * cfg.dim * cfg.shared_dim * bytes_per
                    row["gemm_hbm_fraction"] = experts_bytes / (g.median_us * 1e-6) / ceilings.hbm_bw
                rows.append(row)
    return pd.DataFrame(rows)


def stage_breakdown(moe: MoE, x: torch.Tensor, expert: torch.Tensor, *, quick: bool = True) -> pd.DataFrame:
    """Where one MoE call's time goes: each stage of its code path timed alone.

    Parameters
    ----------
    moe : MoE
        The layer; its ``backend`` picks the path (``use_kernels``).
    x : tensor [T, dim]
        Activations.
    expert : int64 [T, k]
        The routing to run (the router still runs in the ``router`` stage).
    quick : bool
        Fewer repetitions.

    Returns
    -------
    DataFrame
        One row per stage, in path order, then ``whole`` (the full call: router, routed
        experts, shared expert), with ``path`` (``kernels`` or ``torch``), ``stage``,
        ``weight_bytes`` (the weights the stage streams: the distinct local experts', the
        shared expert's, the router's float32 gate; 0 for stages without weights) and the
        timing columns (graph replay on CUDA, host clock on CPU). Kernel path: router (one
        launch), permute (one kernel), gate_up (gate and up of the routed and the shared
        expert in one grouped GEMM with the SiLU product), down (the same two), combine
        (weights, slot sum, shared rows added). Torch path: router, permute (sort, offsets,
        gathered rows), gate_up (two grouped GEMMs), act (SiLU and product), down, combine
        (weights, mask, un-permute, slot sum, shared expert added), shared. ``MoE.forward``
        lets the router's kernel group the slots itself up to ``ROUTER_FUSED_PERMUTE`` tokens;
        here ``expert`` replaces the router's choice, so the permutation is always its own
        kernel.
    """
    cuda = x.is_cuda
    timer = ((lambda fn: time_graph(fn, reps=10 if quick else 30, calls_per_graph=3 if quick else 10)) if cuda
             else (lambda fn: time_host(fn, reps=3 if quick else 10, warmup=1)))
    T, k = expert.shape
    E, h, d = moe.w1.shape
    weight, _ = moe.route(x)
    distinct = int(expert[expert < E].unique().numel())
    wb = moe.w1.element_size()
    hs = moe.shared.w1.weight.shape[0] if moe.shared is not None else 0
    sb = moe.shared.w1.weight.element_size() if moe.shared is not None else 0
    gate_bytes = moe.gate.weight.numel() * moe.gate.weight.element_size()
    stages = [("router", lambda: moe.route(x), gate_bytes)]
    if moe.use_kernels(x):
        sh = (moe.shared.w1.weight, moe.shared.w3.weight, moe.shared.w2.weight) if hs else (None, None, None)
        rows = T * k + (T if hs else 0)
        offs, rowidx, pos, active = ek.permute(expert, E)
        gu_opts, down_opts = ek.layer_gemm_options(T, k, moe.n_routed, E, d)

        def gate_up():
            return ek.grouped_gemm(x, moe.w1, offs, rows, up=moe.w3, rowidx=rowidx, shared=sh[0], shared_up=sh[1],
                                   active=active, **gu_opts)

        hid = gate_up()

        def down():
            return ek.grouped_gemm(hid, moe.w2, offs, rows, shared=sh[2], active=active, **down_opts)

        ys = down()
        stages += [("permute", lambda: ek.permute(expert, E), 0),
                   ("gate_up", gate_up, distinct * 2 * h * d * wb + 2 * hs * d * sb),
                   ("down", down, distinct * h * d * wb + hs * d * sb),
                   ("combine", lambda: ek.combine(ys, pos, weight, T * k if hs else None), 0)]
        path = "kernels"
    else:
        def permute():
            order, local, offs = moe.permute(expert)
            return x[order // k], order, local, offs

        xs, order, local, offs = permute()
        g, u = grouped_linear(xs, moe.w1, offs), grouped_linear(xs, moe.w3, offs)
        hid = torch.nn.functional.silu(g) * u
        ys = grouped_linear(hid, moe.w2, offs)
        base = moe.shared(x) if hs else None

        def combine():
            y = ys * weight.flatten()[order, None].to(x.dtype)
            y = torch.where(local[order, None], y, 0)
            y = torch.empty_like(y).index_copy_(0, order, y).view(T, k, -1).sum(1)
            return y if base is None else y + base

        stages += [("permute", permute, 0),
                   ("gate_up", lambda: (grouped_linear(xs, moe.w1, offs), grouped_linear(xs, moe.w3, offs)),
                    distinct * 2 * h * d * wb),
                   ("act", lambda: torch.nn.functional.silu(g) * u, 0),
                   ("down", lambda: grouped_linear(hid, moe.w2, offs), distinct * h * d * wb),
                   ("combine", combine, 0)]
        if hs:
            stages.append(("shared", lambda: moe.shared(x), 3 * hs * d * sb))
        path = "torch"

    def whole():
        w, _ = moe.route(x)
        return moe.experts(x, w, expert, shared=True, after_router=True)

    stages.append(("whole", whole, gate_bytes + distinct * 3 * h * d * wb + 3 * hs * d * sb))
    rows = [dict(path=path, stage=name, tokens=T, distinct=distinct, weight_bytes=float(nbytes), **timer(fn).as_dict())
            for name, fn, nbytes in stages]
    return pd.DataFrame(rows)


def fp8_support() -> dict:
    """What this torch offers for fp8 e4m3 experts on this GPU: try 128 x 128 block-scaled and
    per-row scaled ``torch._scaled_grouped_mm`` and block-scaled ``torch._scaled_mm`` on tiny
    operands; returns ``{name: "ok" or the error's first line}`` (``{}`` without CUDA)."""
    if not torch.cuda.is_available():
        return {}
    E, M, K, N = 2, 256, 256, 256
    a = torch.randn(M, K, device="cuda").to(FP8)
    b = torch.randn(E, N, K, device="cuda").to(FP8).transpose(-2, -1)
    offs = torch.tensor([128, 256], dtype=torch.int32, device="cuda")
    one = lambda *s: torch.ones(*s, device="cuda")  # noqa: E731
    trials = {
        "scaled_grouped_mm rowwise": lambda: torch._scaled_grouped_mm(a, b, one(M), one(E, N), offs=offs,
                                                                      out_dtype=torch.bfloat16),
        "scaled_grouped_mm block 1x128 / 128x128": lambda: torch._scaled_grouped_mm(
            a, b, one(M, K // 128), one(E, K // 128, N // 128), offs=offs, out_dtype=torch.bfloat16),
        "scaled_mm block 1x128 / 128x128": lambda: torch._scaled_mm(
            a, b[0], one(M, K // 128), one(K // 128, N // 128), out_dtype=torch.bfloat16),
    }
    out = {}
    for name, fn in trials.items():
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - the error text is the finding
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return out
