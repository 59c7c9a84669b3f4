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


# Accepted rows of one sequence that leave the cache (S = 24 rows, M = 5 indices per row):
# name -> (indices row, length, prefix). compact_kv(validate=False) must skip that sequence whole.
GUARD_CASES = {
    "length 0": ([0, 1, 2, -1, -1], 0, 4),
    "negative length": ([0, 1, 2, -1, -1], -2, 4),
    "length past M": ([0, 1, 2, 3, 4], 6, 4),
    "length past MAX_ACCEPT": ([0, 1, 2, 3, 4], 1000, 4),
    "-1 inside length": ([0, 2, -1, -1, -1], 3, 4),
    "large negative index": ([0, -100000, 3, -1, -1], 3, 4),
    "source past the cache": ([0, 2, 30, -1, -1], 3, 4),
    "source far past the cache": ([0, 2, 2**30, -1, -1], 3, 4),
    "destination past the cache": ([0, 0, 0, 0, 0], 5, 21),
    "prefix at the cache's end": ([0, 1, 2, -1, -1], 3, 24),
    "negative prefix": ([0, 1, 2, -1, -1], 3, -3),
}
GUARD_S = 24


def guard_batch(case):
    """(indices int32 [3, 5], length int32 [3], prefix int64 [3]): sequence 1 is ``case``,
    sequences 0 and 2 are consistent and move rows."""
    idx_row, length, prefix_b = GUARD_CASES[case]
    idx = torch.tensor([[0, 2, 3, -1, -1], idx_row, [0, 1, 4, -1, -1]], dtype=torch.int32)
    return idx, torch.tensor([3, length, 3], dtype=torch.int32), torch.tensor([2, prefix_b, 10])
