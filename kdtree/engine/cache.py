"""The latent KV cache: one [layers, B, S, latent] tensor plus per-sequence committed lengths.

MLA caches one row per token shared by all heads: the compressed latent (``kv_lora_rank``)
followed by the rotary key part (``qk_rope_dim``), 576 values for DeepSeek-V3 / Kimi K2. Each
sequence owns a contiguous run of rows (no paging), which is what the verify-attention and
compaction kernels expect: sequence b's committed prefix is ``kv[:, b, :lengths[b]]``, and a
draft tree is written right after it, at ``lengths[b] .. lengths[b] + N - 1``, where
``kdtree.compact_kv`` later moves the accepted rows down. All layers live in one tensor so one
compaction launch serves every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdtree.engine.config import ModelConfig


@dataclass
class KVCache:
    """Latent KV rows and committed lengths.

    Attributes
    ----------
    kv : tensor [layers, B, S, latent_dim]
        ``kv[l]`` is layer l's cache, contiguous per sequence.
    lengths : int64 [B]
        Committed rows per sequence (the prefix a draft tree is appended to).
    """

    kv: torch.Tensor
    lengths: torch.Tensor

    @property
    def capacity(self) -> int:
        """S, rows per sequence."""
        return self.kv.shape[2]

    @property
    def batch(self) -> int:
        return self.kv.shape[1]


def allocate_cache(cfg: ModelConfig, batch: int, capacity: int, device="cpu",
                   dtype: torch.dtype = torch.float32) -> KVCache:
    """A zeroed cache for ``batch`` sequences of up to ``capacity`` rows each.

    Parameters
    ----------
    cfg : ModelConfig
    batch, capacity : int
        B sequences, S rows each; S must also hold the draft tree rows past the longest prefix.
    device, dtype
        Where and in what precision the rows are kept (bf16 for the CUDA kernels).

    Returns
    -------
    KVCache
        With all lengths 0.
    """
    for name, value in (("batch", batch), ("capacity", capacity)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    kv = torch.zeros((cfg.n_layers, batch, capacity, cfg.latent_dim), dtype=dtype, device=device)
    return KVCache(kv, torch.zeros(batch, dtype=torch.int64, device=device))
