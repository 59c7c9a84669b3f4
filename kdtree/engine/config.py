"""Model and drafter configurations, as dataclasses with named presets.

The target is a DeepSeek-V3 / Kimi K2 style decoder: MLA attention (a low-rank "LoRA" query,
a compressed latent KV of ``kv_lora_rank`` values plus ``qk_rope_dim`` rotary values shared by
all heads) and a mixture-of-experts feed-forward (routed top-k experts plus a shared expert,
the first ``first_dense`` layers dense). With weights absorbed, every head attends over the
latent cache rows directly: the query is ``kv_lora_rank + qk_rope_dim`` wide (576 for Kimi K2)
and the attention output ``kv_lora_rank`` wide (512), which is exactly the shape that
``kdtree.verify_attention`` and its kernels take.

Presets (``get_config(name)``):

* ``tiny``: CPU tests. The same structure at toy sizes (latent 32 + rope 8, 4 heads, 2 layers).
* ``tiny_ep``: ``tiny`` as one rank of 4-way expert parallelism (16 experts routed top-4, 4
  local; a shared expert of width 8), for the CPU tests of the EP path.
* ``kimi_k2_attn``: Kimi K2's attention per layer (64 heads, q LoRA 1536, latent 512 + rope 64,
  nope 128, value 128, hidden 7168, vocabulary 163840), with 8 layers and 16 small experts
  (top-4, intermediate 1024) instead of 61 layers and 384 experts, so it fits one GPU: 6.2 B
  parameters, 11.5 GiB in bf16 (the 163840 x 7168 embedding and LM head are 4.4 GiB of it).
* ``kimi_k2_tp8`` / ``_tp4`` / ``_tp2``: one GPU's share of ``kimi_k2_attn`` under tensor
  parallelism (8, 16, 32 heads; the dense and expert intermediates sliced the same way; 5.5,
  6.3, 8.1 GiB). The all-reduces a real TP deployment adds are not modelled.
* ``kimi_k2_ep8``: one GPU's share of the real Kimi K2 on 8 GPUs, TP8 attention and EP8 experts
  (``kimi_k2_shard``): 8 heads; the 384 routed experts (top-8, expert intermediate 2048) routed
  in full by a float32 router, of which this GPU holds and computes 48; the shared expert and
  the first (dense, intermediate 18432) layer sliced 8 ways; the LM head vocabulary-parallel
  (20480 of 163840 rows). One MoE layer holds 4.3 GB of bf16 weights on the GPU, so 33 of the
  61 layers fit an H200's 139 GiB with 10 GB to spare (``fitting_layers``).
* ``kimi_k2_ep8_fp8``: the same with the experts in float8 e4m3 with per-output-channel float32
  scales (the scaling ``torch._scaled_grouped_mm`` runs on Hopper; deployments store 128 x 128
  block scales, which move the same bytes to within 0.01%): 2.2 GB a layer, all 61 layers fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of the MLA + MoE target model.

    Attributes
    ----------
    vocab_size, dim, n_layers, n_heads : int
        Vocabulary, hidden width, decoder layers, attention heads.
    q_lora_rank : int
        Width of the low-rank query bottleneck (x -> q_lora_rank -> heads x (nope + rope)).
    kv_lora_rank : int
        Width of the compressed latent KV row (512 in DeepSeek-V3 / Kimi K2).
    qk_nope_dim, qk_rope_dim, v_head_dim : int
        Per-head query/key widths without and with rotary embedding, and the value width.
    inter_dim : int
        Intermediate width of the dense SwiGLU layers.
    moe_inter_dim, n_routed_experts, n_active_experts, n_shared_experts : int
        Per-expert intermediate width, routed experts, experts per token, shared experts.
    first_dense : int
        The first ``first_dense`` layers use a dense FFN instead of the MoE.
    routed_scale : float
        Multiplier on the (renormalised) routing weights, as DeepSeek-V3 does.
    rope_theta, norm_eps : float
    expert_parallel : int
        EP ways: routing runs over all ``n_routed_experts``, this GPU holds and computes the
        first ``n_local_experts = n_routed_experts // expert_parallel`` of them (rank 0's share;
        the other ranks' slots are dropped here and arrive through the combine, which a real
        deployment adds and the engine does not).
    shared_inter_dim : int
        Intermediate width of the shared expert(s) on this GPU; 0 means
        ``moe_inter_dim * n_shared_experts`` (unsliced).
    expert_fp8 : bool
        Routed experts stored as float8 e4m3 with per-output-channel float32 scales.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    inter_dim: int
    moe_inter_dim: int
    n_routed_experts: int
    n_active_experts: int
    n_shared_experts: int = 1
    first_dense: int = 1
    routed_scale: float = 1.0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    expert_parallel: int = 1
    shared_inter_dim: int = 0
    expert_fp8: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "q_lora_rank", "kv_lora_rank",
                     "qk_nope_dim", "qk_rope_dim", "v_head_dim", "inter_dim", "moe_inter_dim",
                     "n_routed_experts", "n_active_experts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.qk_rope_dim % 2:
            raise ValueError(f"qk_rope_dim: rotary pairs need an even width, got {self.qk_rope_dim}")
        if self.n_active_experts > self.n_routed_experts:
            raise ValueError(f"n_active_experts: {self.n_active_experts} exceeds n_routed_experts "
                             f"{self.n_routed_experts}")
        if not 0 <= self.first_dense <= self.n_layers:
            raise ValueError(f"first_dense: expected 0..n_layers={self.n_layers}, got {self.first_dense}")
        if self.n_shared_experts < 0:
            raise ValueError(f"n_shared_experts: expected >= 0, got {self.n_shared_experts}")
        ep = self.expert_parallel
        if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1 or self.n_routed_experts % ep:
            raise ValueError(f"expert_parallel: expected a positive int dividing n_routed_experts="
                             f"{self.n_routed_experts}, got {ep!r}")
        if not isinstance(self.shared_inter_dim, int) or self.shared_inter_dim < 0:
            raise ValueError(f"shared_inter_dim: expected an int >= 0, got {self.shared_inter_dim!r}")

    @property
    def n_local_experts(self) -> int:
        """Routed experts this GPU holds and computes: n_routed_experts // expert_parallel."""
        return self.n_routed_experts // self.expert_parallel

    @property
    def shared_dim(self) -> int:
        """Intermediate width of the shared expert(s) on this GPU (0: none)."""
        if not self.n_shared_experts:
            return 0
        return self.shared_inter_dim or self.moe_inter_dim * self.n_shared_experts

    @property
    def latent_dim(self) -> int:
        """Width of one latent cache row and of the absorbed query: kv_lora_rank + qk_rope_dim."""
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def softmax_scale(self) -> float:
        """1 / sqrt(nope + rope): the scale of the un-absorbed q.k, which absorption preserves."""
        return (self.qk_nope_dim + self.qk_rope_dim) ** -0.5


@dataclass(frozen=True)
class DrafterConfig:
    """Shapes of the block drafter's small transformer (see ``drafter.py``).

    Attributes
    ----------
    dim, n_layers, n_heads, inter_dim : int
        Width, layers, heads and SwiGLU intermediate of the drafter transformer.
    draft_len : int
        L, draft positions after the root (the paper's block drafter uses 15 to 16).
    """

    dim: int
    n_layers: int
    n_heads: int
    inter_dim: int
    draft_len: int = 15

    def __post_init__(self):
        for name in ("dim", "n_layers", "n_heads", "inter_dim", "draft_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide dim {self.dim}")
        if self.draft_len > 32:
            raise ValueError(f"draft_len: build_tree takes at most 32 draft positions, got {self.draft_len}")


_KIMI = ModelConfig(vocab_size=163840, dim=7168, n_layers=8, n_heads=64, q_lora_rank=1536,
                    kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
                    inter_dim=18432, moe_inter_dim=1024, n_routed_experts=16, n_active_experts=4,
                    n_shared_experts=1, first_dense=1, routed_scale=2.827, rope_theta=50000.0)


def tp_slice(cfg: ModelConfig, tp: int) -> ModelConfig:
    """One GPU's share of ``cfg`` under ``tp``-way tensor parallelism.

    Heads and the dense/expert intermediate widths are split ``tp`` ways (column/row-parallel
    slices); the latent width, hidden width and vocabulary stay whole. Communication is not
    modelled: this is the per-GPU compute and memory traffic of one step.
    """
    for name, width in (("n_heads", cfg.n_heads), ("inter_dim", cfg.inter_dim),
                        ("moe_inter_dim", cfg.moe_inter_dim)):
        if width % tp:
            raise ValueError(f"tp: {tp} does not divide {name}={width}")
    return replace(cfg, n_heads=cfg.n_heads // tp, inter_dim=cfg.inter_dim // tp,
                   moe_inter_dim=cfg.moe_inter_dim // tp)


def kimi_k2_shard(gpus: int = 8, layers: int = 61, fp8: bool = False) -> ModelConfig:
    """One GPU's share of the real Kimi K2 on ``gpus`` GPUs: TP attention, EP experts.

    Kimi K2: 61 layers (the first dense, intermediate 18432), 64 heads of MLA (q LoRA 1536,
    latent 512 + rope 64), hidden 7168, 384 routed experts (top-8, intermediate 2048, routed
    scale 2.827) plus one shared expert, vocabulary 163840. Per GPU: ``64 / gpus`` heads, the
    dense FFN, the shared expert and the LM head sliced ``gpus`` ways (the LM head by vocabulary
    rows), and ``384 / gpus`` whole routed experts; routing still scores all 384.
    """
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1 or any(w % gpus for w in (64, 384, 18432, 2048)):
        raise ValueError(f"gpus: expected a divisor of 64 heads, 384 experts and 2048, got {gpus!r}")
    return ModelConfig(vocab_size=163840 // gpus, dim=7168, n_layers=layers, n_heads=64 // gpus,
                       q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
                       inter_dim=18432 // gpus, moe_inter_dim=2048, n_routed_experts=384, n_active_experts=8,
                       n_shared_experts=1, first_dense=1, routed_scale=2.827, rope_theta=50000.0,
                       expert_parallel=gpus, shared_inter_dim=2048 // gpus, expert_fp8=fp8)


def weight_bytes(cfg: ModelConfig, layers: int | None = None) -> dict[str, int]:
    """Bytes of one GPU's weights (bf16, fp8 experts at 1 byte plus a float32 scale per row).

    Returns a dict: ``dense_layer``, ``moe_layer``, ``embed_head`` and ``total`` for ``layers``
    layers (default ``cfg.n_layers``).
    """
    d, H, r = cfg.dim, cfg.n_heads, cfg.kv_lora_rank
    attn = (d * cfg.q_lora_rank + cfg.q_lora_rank * H * (cfg.qk_nope_dim + cfg.qk_rope_dim)
            + d * (r + cfg.qk_rope_dim) + r * H * (cfg.qk_nope_dim + cfg.v_head_dim) + H * cfg.v_head_dim * d
            + cfg.q_lora_rank + r + 2 * d) * 2
    e, h = cfg.n_local_experts, cfg.moe_inter_dim
    experts = e * 3 * h * d * (1 if cfg.expert_fp8 else 2) + (e * (2 * h + d) * 4 if cfg.expert_fp8 else 0)
    moe = attn + experts + 3 * d * cfg.shared_dim * 2 + cfg.n_routed_experts * d * 4
    dense = attn + 3 * d * cfg.inter_dim * 2
    n = cfg.n_layers if layers is None else layers
    embed_head = 2 * cfg.vocab_size * d * 2 + d * 2
    total = embed_head + min(cfg.first_dense, n) * dense + max(n - cfg.first_dense, 0) * moe
    return {"dense_layer": dense, "moe_layer": moe, "embed_head": embed_head, "total": total}


def fitting_layers(cfg: ModelConfig, memory_bytes: float = 139 * 2**30, reserve: float = 10e9) -> int:
    """The most layers (at most ``cfg.n_layers``) whose weights fit ``memory_bytes`` less ``reserve``
    (KV cache, activations, workspaces, the CUDA context)."""
    w = weight_bytes(cfg, 0)
    room = memory_bytes - reserve - w["embed_head"] - cfg.first_dense * w["dense_layer"]
    return max(0, min(cfg.n_layers, cfg.first_dense + int(room // w["moe_layer"])))


_TINY = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_dim=16,
                    qk_rope_dim=8, v_head_dim=16, inter_dim=128, moe_inter_dim=32, n_routed_experts=8,
                    n_active_experts=2)
_EP8 = kimi_k2_shard(8)
_EP8_FP8 = kimi_k2_shard(8, fp8=True)

MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": _TINY,
    "tiny_ep": replace(_TINY, n_routed_experts=16, n_active_experts=4, expert_parallel=4, shared_inter_dim=8),
    "kimi_k2_attn": _KIMI,
    "kimi_k2_tp8": tp_slice(_KIMI, 8),
    "kimi_k2_tp4": tp_slice(_KIMI, 4),
    "kimi_k2_tp2": tp_slice(_KIMI, 2),
    "kimi_k2_ep8": replace(_EP8, n_layers=fitting_layers(_EP8)),
    "kimi_k2_ep8_fp8": replace(_EP8_FP8, n_layers=fitting_layers(_EP8_FP8)),
}

DRAFTER_PRESETS: dict[str, DrafterConfig] = {
    "tiny": DrafterConfig(dim=32, n_layers=1, n_heads=2, inter_dim=64),
    # A DFlash-like block drafter for an 8B-class target: a few layers at the target's width.
    "small": DrafterConfig(dim=2048, n_layers=4, n_heads=16, inter_dim=6144),
}


def get_config(name: str) -> ModelConfig:
    """The model preset ``name`` (one of ``MODEL_PRESETS``)."""
    if name not in MODEL_PRESETS:
        raise ValueError(f"name: unknown model preset {name!r}; have {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


def get_drafter_config(name: str) -> DrafterConfig:
    """The drafter preset ``name`` (one of ``DRAFTER_PRESETS``)."""
    if name not in DRAFTER_PRESETS:
        raise ValueError(f"name: unknown drafter preset {name!r}; have {sorted(DRAFTER_PRESETS)}")
    return DRAFTER_PRESETS[name]
