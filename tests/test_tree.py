"""CPU suite for the tree ops: the reference build, accept, compaction, top-K, bad input."""
import itertools

import numpy as np
import pytest
import torch

import kdtree
from kdtree.tree import Tree, build_tree_reference, heap_build, visibility_reference
from tree_cases import sorted_logprobs


def brute_force(lp: np.ndarray, budget: int):
    """Every prefix with its score computed the reference's way, sorted by (-score, ranks)."""
    L, K = lp.shape
    rows = lp.astype(np.float64).tolist()
    scores = {(): 0.0}
    for d in range(1, L + 1):
        for path in itertools.product(range(K), repeat=d):
            parent, r = path[:-1], path[-1]
            w = scores[parent] + rows[d - 1][0]
            for j in range(r):
                w = (w - rows[d - 1][j]) + rows[d - 1][j + 1]
            scores[path] = w
    ranked = sorted((p for p in scores if p), key=lambda p: (-scores[p], p))
    return ranked[:budget]


def paths_of(parents, ranks):
    out = [()]
    for i in range(1, len(parents)):
        out.append(out[parents[i]] + (ranks[i],))
    return out


@pytest.mark.parametrize("kind", ["random", "ties", "equal_rows", "constant"])
@pytest.mark.parametrize("L,K,budget", [(1, 1, 1), (3, 3, 10), (2, 4, 30), (4, 2, 40), (3, 1, 5), (1, 5, 3)])
def test_heap_build_is_top_budget_prefixes(kind, L, K, budget, gen):
    lp, _ = sorted_logprobs(1, L, K, gen, kind)
    parents, ranks, depths = heap_build(lp[0].numpy(), budget)
    got = paths_of(parents, ranks)[1:]
    assert got == brute_force(lp[0].numpy(), budget)
    assert depths == [len(p) for p in [()] + got]


def test_heap_runs_dry_when_fewer_prefixes_than_budget(gen):
    lp, tok = sorted_logprobs(2, 2, 2, gen)
    tree = build_tree_reference(lp, tok, budget=50)
    assert tree.num_nodes.tolist() == [7, 7]  # 1 + 2 + 4
    assert tree.tokens.shape == (2, 51)
    assert (tree.parents[:, 7:] == -1).all() and (tree.tokens[:, 7:] == -1).all()
    assert (tree.depth[:, 7:] == -1).all() and (tree.visibility[:, 7:] == 0).all()


@pytest.mark.parametrize("B,L,K,budget", [(3, 15, 16, 64), (2, 5, 8, 100), (1, 32, 4, 130)])
def test_reference_tree_invariants(B, L, K, budget, gen):
    lp, tok = sorted_logprobs(B, L, K, gen)
    roots = torch.randint(0, 100, (B,), generator=gen)
    tree = kdtree.build_tree(lp, tok, budget, root_tokens=roots)
    N = budget + 1
    assert tree.tokens.dtype == tree.parents.dtype == tree.depth.dtype == torch.int32
    assert tree.visibility.shape == (B, N, (N + 63) // 64) and tree.visibility.dtype == torch.int64
    assert tree.tokens[:, 0].tolist() == roots.tolist()
    for b in range(B):
        n = int(tree.num_nodes[b])
        par, dep = tree.parents[b, :n], tree.depth[b, :n]
        assert (par[1:] < torch.arange(1, n)).all()
        assert (dep[1:] == dep[par[1:].long()] + 1).all()
        assert int(dep.max()) <= L
    assert torch.equal(tree.visibility, visibility_reference(tree.parents, tree.num_nodes))


def test_tokens_are_gathered_by_depth_and_rank(gen):
    lp, tok = sorted_logprobs(1, 4, 6, gen)
    parents, ranks, depths = heap_build(lp[0].numpy(), 20)
    tree = kdtree.build_tree(lp, tok, 20)
    for i in range(1, 21):
        assert int(tree.tokens[0, i]) == int(tok[0, depths[i] - 1, ranks[i]])


def test_paper_and_serving_paths_agree(gen):
    lp, tok = sorted_logprobs(3, 6, 9, gen, "ties")
    a = build_tree_reference(lp, tok, 40, path="paper")
    b = build_tree_reference(lp, tok, 40, path="serving")
    for f in ("tokens", "parents", "depth", "num_nodes", "visibility"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_from_parents_matches_build(gen):
    lp, tok = sorted_logprobs(2, 7, 5, gen)
    tree = kdtree.build_tree(lp, tok, 70)
    again = Tree.from_parents(tree.parents, tree.tokens, draft_depth=7)
    assert torch.equal(again.depth, tree.depth) and torch.equal(again.visibility, tree.visibility)
    assert torch.equal(again.num_nodes, tree.num_nodes)


def chain_tree(B, L):
    """A chain root -> 1 -> 2 ... -> L with token t at node t."""
    parents = torch.arange(-1, L, dtype=torch.int32).expand(B, L + 1).contiguous()
    tokens = torch.arange(L + 1, dtype=torch.int32).expand(B, L + 1).contiguous()
    return Tree.from_parents(parents, tokens, draft_depth=L)


def test_accept_full_depth_and_root_only():
    tree = chain_tree(2, 5)
    target = torch.stack([torch.arange(1, 7), torch.full((6,), 99)])  # seq 0 agrees everywhere
    acc = kdtree.accept_tree(tree, target)
    assert acc.length.tolist() == [6, 1]
    assert acc.indices[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert acc.indices[1].tolist() == [0, -1, -1, -1, -1, -1]
    assert acc.bonus.tolist() == [6, 99]


def test_accept_prefers_lowest_index_among_equal_tokens():
    parents = torch.tensor([[-1, 0, 0, 1, 2]], dtype=torch.int32)
    tokens = torch.tensor([[7, 5, 5, 8, 9]], dtype=torch.int32)
    tree = Tree.from_parents(parents, tokens, draft_depth=2)
    target = torch.tensor([[5, 8, 9, 1, 2]])
    acc = kdtree.accept_tree(tree, target)
    assert acc.indices.tolist() == [[0, 1, 3]] and acc.bonus.tolist() == [1]


def test_compact_moves_accepted_rows_per_prefix(gen):
    B, S, D = 3, 40, 8
    kv = torch.randn(B, S, D, generator=gen)
    prefix = torch.tensor([0, 5, 17])
    acc = kdtree.Accepted(torch.tensor([[0, 2, 6, -1], [0, -1, -1, -1], [0, 1, 3, 9]], dtype=torch.int32),
                          torch.tensor([3, 1, 4], dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
    before = kv.clone()
    kdtree.compact_kv(kv, prefix, acc)
    for b in range(B):
        P, n = int(prefix[b]), int(acc.length[b])
        for i in range(n):
            assert torch.equal(kv[b, P + i], before[b, P + int(acc.indices[b, i])])
        assert torch.equal(kv[b, :P], before[b, :P]) and torch.equal(kv[b, P + n:], before[b, P + n:])


def test_topk_logprobs_matches_log_softmax(gen):
    logits = torch.randn(2, 3, 100, generator=gen)
    logits[0, 0, :60] = float("-inf")
    lp, tok = kdtree.topk_logprobs(logits, 64)
    ref = torch.log_softmax(logits, -1)
    assert lp.dtype == torch.float32 and tok.dtype == torch.int64 and lp.shape == (2, 3, 64)
    assert (lp[..., 1:] <= lp[..., :-1]).all() and torch.isfinite(lp).all()
    fin = torch.isfinite(ref.gather(-1, tok))
    assert torch.allclose(lp[fin], ref.gather(-1, tok)[fin])
    assert torch.equal(ref.topk(64, -1).values[fin], lp[fin])
    kdtree.build_tree(lp, tok, 32)  # clamped -inf is accepted by the builder


# --- bad input: a clear error naming the argument, before anything runs -------------------------

def _good(gen):
    return sorted_logprobs(2, 4, 8, gen)


@pytest.mark.parametrize("mutate,exc,word", [
    (lambda lp, tok: (lp.double(), tok, 8), TypeError, "logprobs"),
    (lambda lp, tok: (lp, tok.float(), 8), TypeError, "tokens"),
    (lambda lp, tok: (lp[0], tok[0], 8), ValueError, "logprobs"),
    (lambda lp, tok: (lp, tok[:, :, :4], 8), ValueError, "tokens"),
    (lambda lp, tok: (lp.transpose(1, 2).contiguous().transpose(1, 2), tok, 8), ValueError, "contiguous"),
    (lambda lp, tok: (lp.index_fill(2, torch.tensor([3]), float("nan")), tok, 8), ValueError, "NaN"),
    (lambda lp, tok: (lp.index_fill(2, torch.tensor([0]), float("inf")), tok, 8), ValueError, "infinite"),
    (lambda lp, tok: (lp.flip(-1).contiguous(), tok, 8), ValueError, "sorted"),
    (lambda lp, tok: (lp, tok, 0), ValueError, "budget"),
    (lambda lp, tok: (lp, tok, 1025), ValueError, "budget"),
    (lambda lp, tok: (lp, tok, 8.0), TypeError, "budget"),
    (lambda lp, tok: (torch.zeros(1, 4, 1025), torch.zeros(1, 4, 1025, dtype=torch.long), 8), ValueError, "top-K"),
    (lambda lp, tok: (torch.zeros(1, 33, 2), torch.zeros(1, 33, 2, dtype=torch.long), 8), ValueError, "depth"),
])
def test_build_tree_bad_input(mutate, exc, word, gen):
    lp, tok, budget = mutate(*_good(gen))
    with pytest.raises(exc, match=word):
        kdtree.build_tree(lp, tok, budget)


def test_build_tree_bad_root_and_backend(gen):
    lp, tok = _good(gen)
    with pytest.raises(ValueError, match="root_tokens"):
        kdtree.build_tree(lp, tok, 8, root_tokens=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="backend"):
        kdtree.build_tree(lp, tok, 8, backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        kdtree.build_tree(lp, tok, 8, backend="triton")


def test_accept_and_compact_bad_input(gen):
    tree = chain_tree(2, 3)
    with pytest.raises(ValueError, match="target_tokens"):
        kdtree.accept_tree(tree, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="target_tokens"):
        kdtree.accept_tree(tree, torch.zeros(2, 4))
    with pytest.raises(TypeError, match="tree"):
        kdtree.accept_tree("tree", torch.zeros(2, 4, dtype=torch.long))
    acc = kdtree.accept_tree(tree, torch.zeros(2, 4, dtype=torch.long))
    kv = torch.randn(2, 10, 4)
    before = kv.clone()
    with pytest.raises(ValueError, match="prefix_lens"):
        kdtree.compact_kv(kv, torch.tensor([0, 10]), acc)
    with pytest.raises(ValueError, match="prefix_lens"):
        kdtree.compact_kv(kv, torch.tensor([0, 1, 2]), acc)
    with pytest.raises(ValueError, match="kv"):
        kdtree.compact_kv(kv[..., ::2], torch.tensor([0, 1]), acc)
    assert torch.equal(kv, before)  # nothing written on error
    with pytest.raises(ValueError, match="k"):
        kdtree.topk_logprobs(torch.randn(2, 10), 11)
