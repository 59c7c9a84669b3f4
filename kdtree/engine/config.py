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
* ``kimi_k2_attn``: Kimi K2's attention per layer (64 heads, q LoRA 1536, latent 512 + rope 64,
  nope 128, value 128, hidden 7168, vocabulary 163840), with 8 layers and 16 small experts
  (top-4, intermediate 1024) instead of 61 layers and 384 experts, so it fits one GPU: 6.2 B
  parameters, 11.5 GiB in bf16 (the 163840 x 7168 embedding and LM head are 4.4 GiB of it).
* ``kimi_k2_tp8`` / ``_tp4`` / ``_tp2``: one GPU's share of ``kimi_k2_attn`` under tensor
  parallelism (8, 16, 32 heads; the dense and expert intermediates sliced the same way; 5.5,
  6.3, 8.1 GiB). The all-reduces a real TP deployment adds are not modelled.
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


MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, q_lora_rank=32,
                        kv_lora_rank=32, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
                        inter_dim=128, moe_inter_dim=32, n_routed_experts=8, n_active_experts=2),
    "kimi_k2_attn": _KIMI,
    "kimi_k2_tp8": tp_slice(_KIMI, 8),
    "kimi_k2_tp4": tp_slice(_KIMI, 4),
    "kimi_k2_tp2": tp_slice(_KIMI, 2),
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
