"""A DeepSeek-V3 / Kimi K2 style decoder with random weights: MLA attention and an MoE FFN.

One forward function serves every mode, because every mode is a tree: prefill is a chain over
the prompt at prefix 0, autoregressive decode is a one-node tree, and DDTree verify is the
draft tree. Node i of a tree sits at position ``prefix_len + depth[i]``, writes its latent KV
row at cache row ``prefix_len + i``, and attends to the whole prefix plus the tree rows its
visibility bitmask marks (its ancestors and itself).

Attention runs in the weight-absorbed form that decode-time MLA uses: the key up-projection is
folded into the query (``q_nope @ W_UK`` per head, 512 wide for Kimi K2) and the value
up-projection applied after attention, so every head attends over the shared 576-wide latent
rows. Two implementations of that attention, picked per call by ``attend``:

* ``kdtree.verify_attention`` (bf16 CUDA tensors at the kernels' shapes: latent 576, heads in
  8..128, at most 1025 nodes), the code path the workbook measures;
* ``latent_attention`` here, in float32 for any shape, device and dtype. It is what makes the
  CPU lossless test exact, and the fallback for shapes the kernels do not take.

Both take their mask from the same place: ``kdtree.tree.visibility_mask`` expands ``Tree.visibility``
(the float64 reference of ``kdtree.attention`` does too).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kdtree.attention import D_QK, HEADS, MAX_NODES, verify_attention
from kdtree import experts as expert_kernels
from kdtree.engine.cache import KVCache
from kdtree.engine.config import ModelConfig
from kdtree.tree import Tree, visibility_mask


def latent_attention(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float,
                     v_dim: int) -> torch.Tensor:
    """Masked absorbed-MLA attention, computed in float32.

    Parameters
    ----------
    q : tensor [B, N, H, D]
        Absorbed queries (D = kv_lora_rank + qk_rope_dim).
    kv : tensor [B, S, D]
        Latent cache rows; the values are their first ``v_dim`` entries.
    mask : bool tensor [B, N, S]
        ``visibility_mask``: which rows each query may see.
    scale : float
        Softmax scale.
    v_dim : int
        kv_lora_rank.

    Returns
    -------
    tensor [B, N, H, v_dim] in q's dtype
        A row that sees nothing (a padding node with an empty prefix) gets zeros rather than
        NaN, as the kernels do.
    """
    s = torch.einsum("bnhd,bsd->bnhs", q.float(), kv.float()) * scale
    s = s.masked_fill(~mask[:, :, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0.0))
    o = torch.einsum("bnhs,bsd->bnhd", p, kv[..., :v_dim].float())
    return (o / p.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)).to(q.dtype)


def use_kernel(q: torch.Tensor) -> bool:
    """Whether ``kdtree.verify_attention`` takes this absorbed query [B, N, H, D]."""
    _, N, H, D = q.shape
    return q.is_cuda and q.dtype == torch.bfloat16 and D == D_QK and H in HEADS and N <= MAX_NODES


def inv_freq(cfg: ModelConfig, device=None) -> torch.Tensor:
    """Rotary frequencies theta^(-2i / r) of the r = qk_rope_dim rotary dims, float32."""
    half = torch.arange(0, cfg.qk_rope_dim, 2, dtype=torch.float32, device=device)
    return cfg.rope_theta ** -(half / cfg.qk_rope_dim)


def attend(qa: torch.Tensor, kv: torch.Tensor, prefix_lens: torch.Tensor, tree: Tree, scale: float,
           v_dim: int) -> torch.Tensor:
    """Absorbed attention of qa [B, N, H, D] over kv [B, S, D]: the kernel where it applies, else float32.

    Returns the latent output [B, N, H, v_dim] in qa's dtype.
    """
    if use_kernel(qa):
        return verify_attention(qa.contiguous(), kv, prefix_lens, tree, scale, check_values=False)[0]
    return latent_attention(qa, kv, visibility_mask(tree.visibility, prefix_lens, kv.shape[1]), scale, v_dim)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of x [B, N, ..., r] at positions [B, N]."""
    ang = positions.float()[..., None] * inv_freq                   # [B, N, r/2]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class MLA(nn.Module):
    """Multi-head latent attention, run absorbed over the latent cache."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H, r = cfg.n_heads, cfg.kv_lora_rank
        self.wq_a = nn.Linear(cfg.dim, cfg.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
        self.wq_b = nn.Linear(cfg.q_lora_rank, H * (cfg.qk_nope_dim + cfg.qk_rope_dim), bias=False)
        self.wkv_a = nn.Linear(cfg.dim, r + cfg.qk_rope_dim, bias=False)
        self.kv_norm = RMSNorm(r, cfg.norm_eps)
        self.wkv_b = nn.Linear(r, H * (cfg.qk_nope_dim + cfg.v_head_dim), bias=False)
        self.wo = nn.Linear(H * cfg.v_head_dim, cfg.dim, bias=False)
        self.register_buffer("inv_freq", inv_freq(cfg), persistent=False)

    def forward(self, x, positions, kv, prefix_lens, tree: Tree):
        """x [B, N, dim] at positions [B, N]; writes rows into kv [B, S, latent]; returns [B, N, dim]."""
        cfg = self.cfg
        B, N, _ = x.shape
        H, r, nope = cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_dim
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, N, H, nope + cfg.qk_rope_dim)
        q_nope, q_rope = q.split([nope, cfg.qk_rope_dim], dim=-1)
        c, k_rope = self.wkv_a(x).split([r, cfg.qk_rope_dim], dim=-1)
        row = torch.cat((self.kv_norm(c), rope(k_rope, positions, self.inv_freq)), dim=-1)
        dest = (prefix_lens[:, None] + torch.arange(N, device=x.device))[..., None]
        kv.scatter_(1, dest.expand(B, N, cfg.latent_dim), row.to(kv.dtype))
        # Absorption: q_nope . (W_UK c) == (q_nope W_UK) . c, so the key never leaves the latent.
        w = self.wkv_b.weight.view(H, nope + cfg.v_head_dim, r)
        q_abs = torch.einsum("bnhd,hdr->bnhr", q_nope, w[:, :nope])
        qa = torch.cat((q_abs, rope(q_rope, positions, self.inv_freq)), dim=-1).to(kv.dtype)
        o_lat = attend(qa, kv, prefix_lens, tree, cfg.softmax_scale, r)
        o = torch.einsum("bnhr,hvr->bnhv", o_lat.to(x.dtype), w[:, nope:])
        return self.wo(o.reshape(B, N, H * cfg.v_head_dim))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, inter: int):
        super().__init__()
        self.w1 = nn.Linear(dim, inter, bias=False)
        self.w3 = nn.Linear(dim, inter, bias=False)
        self.w2 = nn.Linear(inter, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float8 e4m3 with one float32 scale per row: ``x ~= q.float() * scale[..., None]``.

    Returns ``q`` (float8_e4m3fn, x's shape) and ``scale`` (float32, x's shape without the last
    dim), the scale being the row's largest magnitude over 448 (e4m3's largest finite value).
    """
    scale = x.float().abs().amax(-1).clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale[..., None]).to(FP8), scale


def grouped_linear(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                   scale: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``offs[e-1]:offs[e]`` of x [T, in] times expert e's weight w [E, out, in], transposed.

    Rows past ``offs[-1]`` belong to no expert; their output is undefined (callers mask them).
    ``torch._grouped_mm`` (static shapes, no host sync: graph-capturable) runs on CPU and on
    bf16 CUDA tensors; other CUDA dtypes take a masked loop over the experts (every row through
    every expert, the same result at E times the FLOPs). With ``scale`` [E, out] float32, w is
    float8 e4m3 with per-output-channel scales: x is quantized per row and the product runs in
    ``torch._scaled_grouped_mm`` on CUDA (bf16 out), and on CPU as the float32 product of the
    dequantized operands (the reference the CUDA path is tested against).
    """
    if scale is not None:
        xq, xs = quantize_rows(x)
        if x.is_cuda:
            return torch._scaled_grouped_mm(xq, w.transpose(-2, -1), xs, scale, offs=offs, out_dtype=x.dtype)
        wd = w.float() * scale[..., None]
        return torch._grouped_mm(xq.float() * xs[:, None], wd.transpose(-2, -1), offs=offs).to(x.dtype)
    if x.device.type == "cpu" or x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    row = torch.arange(x.shape[0], device=x.device)[:, None]
    start = torch.cat((offs.new_zeros(1), offs[:-1]))
    out = x.new_zeros(x.shape[0], w.shape[1])
    for e in range(w.shape[0]):
        out += torch.where((row >= start[e]) & (row < offs[e]), x @ w[e].T, 0)
    return out


class MoE(nn.Module):
    """DeepSeek-V3 routing: sigmoid scores, top-k experts, renormalised weights, plus shared experts.

    The router runs in float32 whatever the model's dtype: ``build_model`` keeps ``gate.weight``
    in float32 and ``scores`` computes ``x.float() @ gate.weight.float().T``, as DeepSeek-V3's
    reference gate does (Hugging Face ``DeepseekV3`` ``MoEGate``: ``F.linear(hidden.float(),
    weight.float())``). The reason is the top-k. With a bf16 gate matmul the scores carry bf16
    rounding that differs between computation paths of the same token (a one-node decode step
    and an N-node tree verify run different GEMM shapes), so near-tied experts swap places and
    the token's FFN output moves by far more than rounding: the likely cause of a bf16 DDTree
    run on an H200 parting from greedy decoding at a top-2 logit gap seven times the rounding
    noise. In float32 (PyTorch's default keeps TF32 off for float32 matmuls) the scores differ
    between paths only as much as the bf16 input x does. The gate is E x dim: a negligible matmul.

    Expert parallelism (``cfg.expert_parallel`` > 1), as one EP rank runs it: the router scores
    all ``n_routed_experts`` and picks each token's top-k among them; this module holds only the
    first ``n_local_experts`` (rank 0's) and computes only the (token, slot) pairs routed to
    them. The other slots sort after the local ones, outside every group of the grouped GEMM,
    and contribute zero here: on a real deployment the other ranks compute them and the
    combine (an all-reduce or all-to-all, not run here) sums them in. With
    ``expert_parallel=1`` this is the whole MoE. Static shapes throughout (graph-capturable).

    With ``cfg.expert_fp8`` the routed experts are float8 e4m3 with per-output-channel float32
    scales (``w1_scale`` and so on); see ``grouped_linear``.

    ``backend``: ``"auto"`` runs bf16 CUDA layers through ``kdtree.experts``: the router in one
    launch (``route``: the float32 gate GEMM, sigmoid, top-k with ties to the lowest expert id,
    renormalisation and scale; fp8 layers too), and bf16 experts as a permutation kernel, gate
    and up in one grouped weight-streaming GEMM, the down GEMM (the shared expert an extra
    group of both, over all tokens) and a combine that adds the shared rows (five launches a
    layer, router included); everything else runs through torch ops. ``"torch"`` forces the
    torch path (the reference, the CPU path, and the baseline the bench times beside it).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k, self.scale = cfg.n_active_experts, cfg.routed_scale
        E, d, h = cfg.n_local_experts, cfg.dim, cfg.moe_inter_dim
        self.gate = nn.Linear(d, cfg.n_routed_experts, bias=False)  # float32 in every model (build_model)
        self.w1, self.w3 = nn.Parameter(torch.empty(E, h, d)), nn.Parameter(torch.empty(E, h, d))
        self.w2 = nn.Parameter(torch.empty(E, d, h))
        self.fp8 = cfg.expert_fp8
        if self.fp8:
            self.w1_scale, self.w3_scale = nn.Parameter(torch.empty(E, h)), nn.Parameter(torch.empty(E, h))
            self.w2_scale = nn.Parameter(torch.empty(E, d))
        self.shared = SwiGLU(d, cfg.shared_dim) if cfg.shared_dim else None
        self.n_routed = cfg.n_routed_experts
        self.backend = "auto"

    def _auto(self) -> bool:
        if self.backend not in ("auto", "torch"):
            raise ValueError(f"backend: expected 'auto' or 'torch', got {self.backend!r}")
        return self.backend == "auto"

    def use_kernels(self, x: torch.Tensor) -> bool:
        """Whether the routed and shared experts of x [T, dim] run through ``kdtree.experts``."""
        return (self._auto() and not self.fp8
                and expert_kernels.supported(x, self.w1, self.w2, self.k,
                                             self.shared.w1.weight.shape[0] if self.shared is not None else 0))

    def use_router_kernel(self, x: torch.Tensor) -> bool:
        """Whether the router of x [T, dim] runs as ``kdtree.experts.route`` (one launch)."""
        return self._auto() and expert_kernels.router_supported(x, self.gate.weight, self.k)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Routing scores, float32 [T, E]: sigmoid of the float32 gate over x [T, dim] in float32."""
        return torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k routing of x [T, dim]: renormalised, scaled weights (float32) and global expert ids [T, k].

        The kernel (``use_router_kernel``) breaks exact ties of the scores towards the lowest
        expert id; the torch path takes ``torch.topk``'s choice among tied experts.
        """
        if self.use_router_kernel(x):
            return expert_kernels.route(x, self.gate.weight, self.k, float(self.scale))
        weight, expert = self.scores(x).topk(self.k, dim=-1)
        return weight / weight.sum(-1, keepdim=True) * self.scale, expert

    def permute(self, expert: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sort the (token, slot) pairs of expert ids [T, k] by local expert, the other ranks' last.

        Returns ``order`` (int64 [T k], the flat slot indices in sorted order), ``local`` (bool
        [T k], per flat slot: its expert is on this GPU) and ``offs`` (int32 [E_local], the
        grouped GEMM's group ends).
        """
        E = self.w1.shape[0]
        flat = expert.flatten()
        local = flat < E
        key = torch.where(local, flat, E)                     # other ranks' slots sort last
        order = key.argsort(stable=True)
        counts = (key[:, None] == torch.arange(E, device=expert.device)).sum(0)
        return order, local, counts.cumsum(0).to(torch.int32)

    def expert_mlp(self, xs: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """The three grouped GEMMs (gate, up, down) with SiLU over permuted rows xs [T k, dim].

        On the kernel path (``use_kernels``) gate and up run as one grouped GEMM with the SiLU
        product fused, and the down projection comes out in float32.
        """
        if self.use_kernels(xs):
            T = xs.shape[0] // self.k
            nt = expert_kernels.chunk_tiles(T, self.k, self.n_routed)
            h = expert_kernels.grouped_gemm(xs, self.w1, offs, xs.shape[0], up=self.w3, nt=nt)
            return expert_kernels.grouped_gemm(h, self.w2, offs, xs.shape[0], nt=nt)
        s1, s3, s2 = (self.w1_scale, self.w3_scale, self.w2_scale) if self.fp8 else (None, None, None)
        h = F.silu(grouped_linear(xs, self.w1, offs, s1)) * grouped_linear(xs, self.w3, offs, s3)
        return grouped_linear(h, self.w2, offs, s2)

    def experts(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor,
                shared: bool = False, after_router: bool = False, permutation: tuple | None = None) -> torch.Tensor:
        """The routed experts' weighted sum [T, dim] over the slots this GPU holds (expert id < E_local),
        plus the shared expert's output with ``shared`` (if the layer has one).

        Permutes the (token, slot) pairs by expert (local ones first), runs the three grouped
        GEMMs, weights each slot and sums each token's slots back in token order. On the kernel
        path the shared expert runs inside the same grouped GEMMs (``routed_experts``);
        ``after_router``: the last kernel before this call was the router of this x (as in
        ``forward``), so the shared expert may start streaming while it runs (``x_ready``).
        ``permutation``: the kernel path's grouping of ``expert`` by local expert, when the
        router already made it (``kdtree.experts.route_permuted``).
        """
        shared = shared and self.shared is not None
        if self.use_kernels(x):
            sh = (self.shared.w1.weight, self.shared.w3.weight, self.shared.w2.weight) if shared else None
            return expert_kernels.routed_experts(x, weight, expert, self.w1, self.w3, self.w2, sh,
                                                 experts_total=self.n_routed, x_ready=after_router,
                                                 permutation=permutation)
        T = x.shape[0]
        order, local, offs = self.permute(expert)
        ys = self.expert_mlp(x[order // self.k], offs) * weight.flatten()[order, None].to(x.dtype)
        ys = torch.where(local[order, None], ys, 0)           # rows past offs[-1] are undefined
        # Un-sort and sum each token's k slots: deterministic, unlike an atomic index_add.
        y = torch.empty_like(ys).index_copy_(0, order, ys).view(T, self.k, -1).sum(1)
        return y + self.shared(x) if shared else y

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if self.use_kernels(x) and self.use_router_kernel(x):   # the router may group the slots too
            weight, expert, perm = expert_kernels.route_permuted(x, self.gate.weight, self.k, float(self.scale),
                                                                 self.w1.shape[0])
            return self.experts(x, weight, expert, shared=True, after_router=True, permutation=perm).view(shape)
        return self.experts(x, *self.route(x), shared=True, after_router=True).view(shape)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps), RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = MLA(cfg)
        self.ffn = SwiGLU(cfg.dim, cfg.inter_dim) if layer < cfg.first_dense else MoE(cfg)

    def forward(self, x, positions, kv, prefix_lens, tree):
        x = x + self.attn(self.attn_norm(x), positions, kv, prefix_lens, tree)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """The target model. ``forward`` runs one tree (chain, single node or draft tree) per sequence."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, tree: Tree, cache: KVCache,
                nodes: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, N, vocab] of the tree nodes ``tokens`` [B, N] (padding nodes may hold -1).

        Node i sits at position ``cache.lengths + tree.depth[:, i]`` and its latent rows go to
        cache row ``cache.lengths + i`` of every layer; ``cache.lengths`` is left unchanged
        (committing rows is the decode loop's business). Padding nodes produce ignored logits.
        With ``nodes`` [B] given, only node ``nodes[b]`` of each sequence reaches the LM head and
        the result is [B, vocab] (prefill needs the last prompt token's logits only).
        """
        prefix = cache.lengths
        positions = prefix[:, None] + tree.depth.clamp_min(0)
        x = self.embed(tokens.clamp_min(0))
        for layer, block in enumerate(self.layers):
            x = block(x, positions, cache.kv[layer], prefix, tree)
        if nodes is not None:
            x = x[torch.arange(x.shape[0], device=x.device), nodes]
        return self.head(self.norm(x))


@torch.no_grad()
def build_model(cfg: ModelConfig, seed: int = 0, device="cpu",
                dtype: torch.dtype = torch.float32) -> Transformer:
    """The target model with random weights drawn on ``device`` from a generator seeded ``seed``.

    Parameters
    ----------
    cfg : ModelConfig
    seed : int
    device, dtype
        Where the weights live and their precision (bf16 for the CUDA kernels).

    Returns
    -------
    Transformer
        In eval mode without gradients, every weight in ``dtype`` except the MoE routers'
        ``gate.weight``, which stays float32 (see ``MoE``), and fp8 experts (``cfg.expert_fp8``:
        float8 e4m3 weights quantized per output row from N(0, 1 / fan_in) draws, float32
        scales). Linear and expert weights are N(0, 1 / fan_in), so activations and logits stay
        O(1) at any width; embeddings
        N(0, 1); norms 1. Nothing is downloaded. The same seed gives the same weights on the same device type (CPU and CUDA
        generators differ).
    """
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to(dtype)
    moes = [mod for mod in model.modules() if isinstance(mod, MoE)]
    for mod in moes:  # the router stays float32 (see MoE); fp8 experts keep float32 scales
        mod.gate.float()
        if mod.fp8:
            for w in ("w1", "w2", "w3"):
                setattr(mod, w, nn.Parameter(torch.empty_like(getattr(mod, w), dtype=FP8), requires_grad=False))
                getattr(mod, f"{w}_scale").data = getattr(mod, f"{w}_scale").float()
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dtype == FP8 or name.endswith("_scale"):
            continue  # fp8 experts: drawn below
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name == "embed.weight":
            p.normal_(0.0, 1.0, generator=gen)
        else:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    for mod in (m for m in moes if m.fp8):  # drawn in float32 one expert at a time, then quantized
        for w in ("w1", "w2", "w3"):
            q, s = getattr(mod, w), getattr(mod, f"{w}_scale")
            for e in range(q.shape[0]):
                full = torch.empty(q.shape[1:], device=device).normal_(0.0, q.shape[-1] ** -0.5, generator=gen)
                q[e], s[e] = quantize_rows(full)
    for mod in model.modules():
        if isinstance(mod, MLA):  # to_empty left the (float32) buffer uninitialised
            mod.inv_freq = inv_freq(cfg, device)
    return model.eval().requires_grad_(False)
