"""The drafter interface and a synthetic block drafter whose acceptance is a parameter.

A block drafter proposes, in one forward pass, a distribution over the vocabulary for each of
the L positions after the root (the previous bonus token); the decode loop turns that into
per-position top-K log-probs with ``kdtree.topk_logprobs`` and builds the tree from them.

``SyntheticDrafter`` is **synthetic**: it is handed the target's true greedy continuation
(``set_reference``) and mixes it with noise, so the acceptance rate is a knob rather than a
property of a trained model. Its cost is real, though: every call runs a small transformer of
configurable size (``DrafterConfig``) over the L + 1 block positions plus an LM head over the
full vocabulary, so both acceptance and drafter time are realistic in the step breakdown.

"True" means the continuation that the DDTree run being measured actually decodes. In float32
that is greedy autoregressive decoding's output, token for token. In bf16 the target's greedy
choice at a near-tie of its top two logits depends on rounding, which differs between a
one-node decode step and an N-node tree verify, so a DDTree run may part from the
autoregressive tokens (losslessly: every token it emits is still the target's argmax along its
own path). A drafter that kept drafting the autoregressive continuation past such a point would
be drafting for a context the run no longer has, and every acceptance measured after it would
be meaningless. So in bf16 the drafter's truth is the target's greedy continuation along the
decoded path, under the verify's numerics: DDTree's own output, which the measurements find by
iterating to a fixed point (``kdtree.bench.engine_bench.self_consistent_run``).

How the draft distribution is made. The transformer's logits only pick *which* tokens fill the
ranks (its top-R candidates). The probabilities come from a fixed profile: rank 0 gets
``accuracy``, rank r >= 1 gets ``(1 - accuracy) (1 - spread) spread^(r - 1)``, and the tokens
past rank R share what is left. The true token is then swapped into rank r with probability
equal to that rank's mass, so the drafter is calibrated: its stated probabilities are the
probabilities of being right. Which rank the true token takes is a hash of (seed, sequence,
output index, draft offset), stateless and identical under CUDA-graph replay.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from kdtree.engine.config import DrafterConfig
from kdtree.engine.model import RMSNorm, SwiGLU
from kdtree.tree import MAX_TOPK, accept_tree, build_tree, topk_logprobs

# Calibration against the DDTree paper (arXiv 2604.12989), MATH-500 / Qwen3-8B / T = 0: the
# single-chain drafter (DFlash, topk=1, budget = draft_len = 15) accepts about 7.8 tokens per
# step and DDTree at budget 512 about 10.7. ``simulate_acceptance`` (24 sequences of 480 tokens,
# three seeds) gives 7.67 to 7.96 for the chain and 10.68 to 10.79 at budget 512 with these
# values; accuracy 0.896 with spread 0.80 gives 8.0 to 8.1 and 10.8 to 11.1. Only the acceptance
# is calibrated: the target model and the drafter's candidates stay random.
PAPER_MATH500_QWEN3_8B = {"accuracy": 0.893, "spread": 0.82}
# The paper's figures for that setting, to compare against: acceptance lengths of the chain and
# of DDTree at budget 512, and DDTree's speedup over greedy decoding (H200, SDPA tree attention).
PAPER_MATH500_QWEN3_8B_FIGURES = {"tau_chain": 7.8, "tau_ddtree_512": 10.7, "speedup_ddtree": 7.52}

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27, so products of 32-bit values stay inside int64


class Drafter(Protocol):
    """What the DDTree loop needs from a drafter."""

    draft_len: int

    def draft(self, root: torch.Tensor, positions: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """Logits [B, L, vocab] for the L tokens after ``root`` [B].

        ``positions`` [B] is the root's position (the committed cache length) and ``generated``
        [B] how many tokens each sequence has produced, the root included. Must not synchronise
        with the host (the step is captured in a CUDA graph).
        """
        ...


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply, twice) on int64 tensors."""
    for _ in range(2):
        x = ((x ^ (x >> 16)) * _MIX) & _M32
    return x ^ (x >> 16)


def hash_uniform(seed: int, *keys: torch.Tensor) -> torch.Tensor:
    """Uniform floats in (0, 1), a stateless hash of ``seed`` and integer tensors ``keys`` (broadcast)."""
    x = _mix(torch.full((), seed & _M32, dtype=torch.int64, device=keys[0].device))
    for key in keys:
        x = _mix(x ^ (key.long() & _M32))
    return (x.double() + 0.5) / 2.0 ** 32


def rank_profile(accuracy: float, spread: float, ranks: int, vocab: int) -> torch.Tensor:
    """Log-probabilities [ranks + 1]: the profile's ranks 0..ranks-1, then one tail token's value."""
    p = [accuracy] + [(1 - accuracy) * (1 - spread) * spread ** (r - 1) for r in range(1, ranks)]
    tail = max(1.0 - sum(p), 1e-30) / max(vocab - ranks, 1)
    return torch.tensor([math.log(v) for v in p] + [math.log(tail)], dtype=torch.float64)


class DraftBlock(nn.Module):
    """Pre-norm transformer block with bidirectional attention inside the draft block."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.heads = cfg.n_heads
        self.norm1, self.norm2 = RMSNorm(cfg.dim, 1e-6), RMSNorm(cfg.dim, 1e-6)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.ffn = SwiGLU(cfg.dim, cfg.inter_dim)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, D // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(a.transpose(1, 2).reshape(B, T, D))
        return x + self.ffn(self.norm2(x))


class SyntheticDrafter(nn.Module):
    """A synthetic block drafter: real transformer cost, acceptance set by ``accuracy``.

    Parameters
    ----------
    cfg : DrafterConfig
        Size of the drafter transformer and L = ``cfg.draft_len``.
    vocab_size : int
        The target's vocabulary.
    accuracy : float in (0, 1)
        Probability that the true next token is the drafter's top choice at each position
        (the mass of profile rank 0, which is the top rank while accuracy >= (1 - accuracy)
        (1 - spread)).
    spread : float in (0, 1)
        Geometric ratio of the remaining ranks' probabilities: how often a miss is near the top.
    ranks : int
        R, ranks with explicit probabilities (the rest share the tail); capped at vocab - 1.
    seed : int
        Seeds the random weights and the rank hash.
    device, dtype
        Where the drafter runs.
    """

    def __init__(self, cfg: DrafterConfig, vocab_size: int, accuracy: float = 0.8, spread: float = 0.5,
                 ranks: int = 64, seed: int = 0, device="cpu", dtype: torch.dtype = torch.float32):
        super().__init__()
        for name, value in (("accuracy", accuracy), ("spread", spread)):
            if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
                raise ValueError(f"{name}: expected a number in (0, 1), got {value!r}")
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size: expected an int >= 2, got {vocab_size!r}")
        if not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"ranks: expected a positive int, got {ranks!r}")
        self.draft_len, self.seed = cfg.draft_len, seed
        self.ranks = min(ranks, vocab_size - 1)
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.device("meta"):
            self.embed = nn.Embedding(vocab_size, cfg.dim)
            self.pos = nn.Parameter(torch.empty(cfg.draft_len + 1, cfg.dim))
            self.blocks = nn.ModuleList(DraftBlock(cfg) for _ in range(cfg.n_layers))
            self.norm = RMSNorm(cfg.dim, 1e-6)
            self.head = nn.Linear(cfg.dim, vocab_size, bias=False)
        self.to(dtype).to_empty(device=device)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:  # N(0, 1) embeddings, N(0, 1 / fan_in) elsewhere: O(1) activations
                    p.normal_(0.0, 1.0 if name == "embed.weight" else p.shape[-1] ** -0.5, generator=gen)
        profile = rank_profile(accuracy, spread, self.ranks, vocab_size)
        self.register_buffer("profile", profile.to(device=device, dtype=torch.float32), persistent=False)
        self.register_buffer("cdf", profile[:self.ranks].exp().cumsum(0).to(device), persistent=False)
        self.register_buffer("reference", torch.full((1, 1), -1, dtype=torch.int64, device=device),
                             persistent=False)
        self.requires_grad_(False).eval()

    def set_reference(self, tokens: torch.Tensor) -> None:
        """The target's greedy continuation [B, T] (generated index 0 = the first new token); -1 pads.

        The continuation the measured run decodes: greedy autoregressive output in float32,
        DDTree's own output along its decoded path in bf16 (see the module docstring). To
        cover the last drafts of a run of ``max_new_tokens``, T should be at least
        ``max_new_tokens + draft_len``; past the end, drafts are noise.
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError("tokens: expected an integer tensor [B, T] of the target's continuation")
        self.reference = tokens.to(device=self.profile.device, dtype=torch.int64).contiguous()

    @torch.no_grad()
    def draft(self, root: torch.Tensor, positions: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """Logits [B, L, vocab] (see ``Drafter.draft``); needs ``set_reference`` for the true tokens."""
        B, L, R = root.shape[0], self.draft_len, self.ranks
        ref = self.reference
        if ref.shape[0] != B:
            raise ValueError(f"root: batch {B} does not match the reference's {ref.shape[0]} rows "
                             "(call set_reference first)")
        x = self.embed(root)[:, None] + self.pos                          # [B, L + 1, dim]
        for block in self.blocks:
            x = block(x)
        noise = self.head(self.norm(x[:, 1:])).float()                    # [B, L, V]
        cand = noise.topk(R, dim=-1).indices                              # who fills ranks 0..R-1
        out = self.profile[R].expand_as(noise).clone()
        out.scatter_(2, cand, self.profile[:R].expand(B, L, R))
        # The true token of output index generated - 1 + k, and the rank it is drawn into.
        k = torch.arange(1, L + 1, device=root.device)
        j = generated.long()[:, None] - 1 + k                             # [B, L]
        true = ref.gather(1, j.clamp(max=ref.shape[1] - 1))
        known = (j < ref.shape[1]) & (true >= 0)
        true = true.clamp_min(0)[..., None]
        u = hash_uniform(self.seed, torch.arange(B, device=root.device)[:, None], j, k)
        rank = torch.searchsorted(self.cdf, u)                             # R means the tail
        mine = out.gather(2, true)                                        # the true token's value now
        theirs = self.profile[rank][..., None]                            # the value it is given
        partner = cand.gather(2, rank.clamp(max=R - 1)[..., None])        # token now holding that rank
        swap = (known & (rank < R))[..., None]
        out.scatter_(2, partner, torch.where(swap, mine, out.gather(2, partner)))
        out.scatter_(2, true, torch.where(known[..., None], theirs, mine))
        return out


@torch.no_grad()
def simulate_acceptance(drafter: SyntheticDrafter, budget: int, max_new_tokens: int,
                        topk: int | None = None) -> torch.Tensor:
    """Per-step acceptance lengths of greedy DDTree with ``drafter``, without running the target.

    Greedy DDTree is lossless, so with the target's greedy continuation in
    ``drafter.reference``, each step accepts exactly the longest prefix of that continuation
    present in the tree, plus the bonus token: the target's choice at a node of depth d is
    reference token ``generated + d``. This replays the decode loop on that rule: same drafter
    calls, same trees, so it returns the ``Generation.accepted`` that ``generate`` would (exactly,
    when the reference is at least ``max_new_tokens + draft_len`` long), in a fraction of the
    time. It is how the drafter is calibrated against published acceptance lengths. (The
    drafter is called with ``positions = generated``; the synthetic drafter ignores positions.)

    Returns
    -------
    int64 [steps, B]
        Tokens emitted per step (0 once a sequence has ``max_new_tokens``).
    """
    ref = drafter.reference
    B, T = ref.shape
    K = topk or min(budget, drafter.head.out_features, MAX_TOPK)
    n = torch.ones(B, dtype=torch.int64, device=ref.device)
    rows = []
    while bool((n < max_new_tokens).any()):
        root = ref.gather(1, (n - 1)[:, None])[:, 0]
        logprobs, tokens = topk_logprobs(drafter.draft(root, n, n), K)
        tree = build_tree(logprobs, tokens, budget, root_tokens=root)
        target = ref.gather(1, (n[:, None] + tree.depth.clamp_min(0)).clamp(max=T - 1))
        count = torch.where(n < max_new_tokens, accept_tree(tree, target).length.long(), 0)
        rows.append(count)
        n += count
    return torch.stack(rows)
