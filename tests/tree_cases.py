"""Draft inputs for the tree tests: random, tie-heavy and degenerate log-prob tables."""
import torch


def sorted_logprobs(B, L, K, gen, kind="random"):
    """float32 [B, L, K] rows sorted descending, and int64 token ids.

    kind: "random" (continuous values), "ties" (few distinct exactly representable values,
    many repeats), "equal_rows" (every position the same row), "constant" (one value).
    """
    if kind == "random":
        lp = torch.rand(B, L, K, generator=gen) * -8.0
    elif kind == "ties":
        lp = -torch.randint(0, 4, (B, L, K), generator=gen).float() * 0.5
    elif kind == "equal_rows":
        lp = (-torch.randint(0, 3, (B, 1, K), generator=gen).float() * 0.25).expand(B, L, K).clone()
    elif kind == "constant":
        lp = torch.full((B, L, K), -0.75)
    else:
        raise ValueError(kind)
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    tokens = torch.randint(0, 50000, (B, L, K), generator=gen)
    return lp, tokens
