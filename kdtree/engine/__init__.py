"""The torch engine: an MLA + MoE target model with random weights, its latent KV cache, a
synthetic block drafter, and the greedy DDTree decode loop (lossless against autoregressive
decoding). Imported as ``kdtree.engine``; ``kdtree`` itself does not re-export it. Its benchmark
(step breakdowns, throughput sweeps) is ``kdtree.bench.engine_bench``.
"""
from kdtree.engine.cache import KVCache, allocate_cache
from kdtree.engine.config import (DRAFTER_PRESETS, MODEL_PRESETS, DrafterConfig, ModelConfig,
                                  get_config, get_drafter_config, tp_slice)
from kdtree.engine.ddtree import (DecodeState, Generation, ar_phases, capture, chain_tree, ddtree_phases,
                                  generate, needed_capacity, prefill, run_phases, start)
from kdtree.engine.drafter import (PAPER_MATH500_QWEN3_8B, PAPER_MATH500_QWEN3_8B_FIGURES, Drafter, SyntheticDrafter,
                                   simulate_acceptance)
from kdtree.engine.model import Transformer, build_model, latent_attention, visibility_mask

__all__ = ["DRAFTER_PRESETS", "MODEL_PRESETS", "PAPER_MATH500_QWEN3_8B", "PAPER_MATH500_QWEN3_8B_FIGURES", "DecodeState",
           "Drafter", "DrafterConfig", "Generation", "KVCache", "ModelConfig", "SyntheticDrafter", "Transformer",
           "allocate_cache", "ar_phases", "build_model", "capture", "chain_tree", "ddtree_phases", "generate",
           "get_config", "get_drafter_config", "latent_attention", "needed_capacity",
           "prefill", "run_phases", "simulate_acceptance",
           "start", "tp_slice", "visibility_mask"]
