"""Fault matrix of the public ops: every bad input gets the named error and nothing is written.

Rows of the matrix (one test function each, parametrized over its cases):
token ids out of range, inconsistent ``Accepted`` in ``compact_kv``, structural ``compact_kv``
arguments, rows ``topk_logprobs`` cannot turn into a distribution, meta tensors, tensors that
require grad. Each case asserts the error type, that the message names the argument, and that
every tensor the caller passed (the KV cache above all) is bit-for-bit what it was.
"""
import re

import pytest
import torch

import kdtree
from kdtree.tree import MAX_DEPTH, Accepted, Tree
from tree_cases import GUARD_CASES, GUARD_S, guard_batch, sorted_logprobs

BIG = (2**31, 2**32 - 1, 2**40)


def snapshot(*tensors):
    return [t.clone() for t in tensors]


def assert_unchanged(tensors, before):
    """Bit for bit (NaN where NaN was): a rejected call wrote nothing."""
    for t, b in zip(tensors, before):
        torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)


# --- token ids -----------------------------------------------------------------------------------

def chain(B=2, L=4):
    """Root -> 1 -> ... -> L, token t at node t."""
    parents = torch.arange(-1, L, dtype=torch.int32).expand(B, L + 1).contiguous()
    tokens = torch.arange(L + 1, dtype=torch.int32).expand(B, L + 1).contiguous()
    return Tree.from_parents(parents, tokens, draft_depth=L)


def _build(tokens=None, root=None, gen=None):
    lp, tok = sorted_logprobs(2, 3, 4, gen)
    tok = tok if tokens is None else tokens(tok)
    roots = torch.tensor([5, 6]) if root is None else torch.tensor([root, 6])
    return (lambda: kdtree.build_tree(lp, tok, 8, root_tokens=roots)), (lp, tok, roots)


def _poke(value):
    def f(tok):
        tok = tok.clone()
        tok[1, 2, 3] = value
        return tok
    return f


TOKEN_CASES = (
    [("build_tree.tokens", v, "tokens") for v in BIG + (-1, -2**40)]
    + [("build_tree.root_tokens", v, "root_tokens") for v in BIG + (-2,)]
    + [("accept_tree.target_tokens", v, "target_tokens") for v in BIG + (-1,)]
    + [("Tree.from_parents.tokens", v, "tokens") for v in BIG]
)


@pytest.mark.parametrize("where,value,arg", TOKEN_CASES)
def test_token_ids_out_of_int32_range(where, value, arg, gen):
    if where == "build_tree.tokens":
        call, inputs = _build(tokens=_poke(value), gen=gen)
    elif where == "build_tree.root_tokens":
        call, inputs = _build(root=value, gen=gen)
    elif where == "accept_tree.target_tokens":
        tree = chain()
        target = torch.arange(1, 6).expand(2, 5).contiguous()
        target[1, 2] = value
        inputs = (target, tree.tokens)
        call = lambda: kdtree.accept_tree(tree, target)  # noqa: E731
    else:
        parents = torch.tensor([[-1, 0, 1]], dtype=torch.int32)
        tokens = torch.tensor([[3, value, 4]])
        inputs = (parents, tokens)
        call = lambda: Tree.from_parents(parents, tokens)  # noqa: E731
    before = snapshot(*inputs)
    with pytest.raises(ValueError, match=rf"^{arg}: token ids must lie in"):
        call()
    assert_unchanged(inputs, before)


def test_token_ids_at_the_int32_limits_are_kept(gen):
    """The largest id survives the tree and the bonus unchanged (the range check is not off by one)."""
    lp, tok = sorted_logprobs(1, 2, 3, gen)
    tok[0, 0, 0] = 2**31 - 1
    tree = kdtree.build_tree(lp, tok, 3, root_tokens=torch.tensor([-1]))
    assert int(tree.tokens[0, 1]) == 2**31 - 1 and int(tree.tokens[0, 0]) == -1
    target = torch.full((1, 4), 2**31 - 1)
    assert int(kdtree.accept_tree(tree, target).bonus[0]) == 2**31 - 1


def _tree_with(**fields):
    tree = chain()
    return Tree(**{f: fields.get(f, getattr(tree, f)) for f in
                   ("tokens", "parents", "depth", "num_nodes", "visibility", "draft_depth")})


TREE_CASES = {  # name -> (the Tree handed to accept_tree, error, argument named)
    "not a Tree": (lambda: "tree", TypeError, "tree"),
    "tokens int64": (lambda: _tree_with(tokens=chain().tokens.long()), TypeError, "tree.tokens"),
    "parents int64": (lambda: _tree_with(parents=chain().parents.long()), TypeError, "tree.parents"),
    "parents of another shape": (lambda: _tree_with(parents=chain().parents[:, :3].contiguous()), ValueError, "tree"),
    "num_nodes 2-D": (lambda: _tree_with(num_nodes=chain().num_nodes[:, None]), ValueError, "tree.num_nodes"),
    "num_nodes on meta": (lambda: _tree_with(num_nodes=chain().num_nodes.to("meta")), ValueError, "tree.num_nodes"),
    "draft_depth -1": (lambda: _tree_with(draft_depth=-1), ValueError, "tree.draft_depth"),
    "draft_depth 33": (lambda: _tree_with(draft_depth=33), ValueError, "tree.draft_depth"),
}


@pytest.mark.parametrize("case", list(TREE_CASES))
def test_accept_tree_refuses_a_malformed_tree(case):
    make, exc, arg = TREE_CASES[case]
    target = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(exc, match=rf"^{arg}:"):
        kdtree.accept_tree(make(), target)
    assert torch.equal(target, torch.zeros(2, 5, dtype=torch.long))


# --- compact_kv: an inconsistent Accepted is refused before the first write -------------------------

M = 5  # indices per row (draft depth 4 + root)


def good_accepted(B):
    idx = torch.full((B, M), -1, dtype=torch.int32)
    idx[:, :3] = torch.tensor([0, 2, 4], dtype=torch.int32)
    return Accepted(idx, torch.full((B,), 3, dtype=torch.int32), torch.zeros(B, dtype=torch.int32))


def _set(field, values):
    def f(acc, b):
        getattr(acc, field)[b] = torch.as_tensor(values, dtype=torch.int32)
    return f


ACCEPTED_CASES = {  # name -> (mutation of sequence b, prefix of sequence b, argument named)
    "length 0": (_set("length", 0), 4, "accepted.length"),
    "length past M": (_set("length", M + 1), 4, "accepted.length"),
    "negative length": (_set("length", -3), 4, "accepted.length"),
    "-1 inside length": (_set("indices", [0, 2, -1, -1, -1]), 4, "accepted.indices"),
    "negative index": (_set("indices", [0, -7, 4, -1, -1]), 4, "accepted.indices"),
    "root not first": (_set("indices", [1, 2, 4, -1, -1]), 4, "accepted.indices"),
    "not increasing": (_set("indices", [0, 4, 2, -1, -1]), 4, "accepted.indices"),
    "repeated index": (_set("indices", [0, 2, 2, -1, -1]), 4, "accepted.indices"),
    "source row past the cache": (_set("indices", [0, 2, 40, -1, -1]), 4, "prefix_lens"),
    "prefix near the cache's end": (lambda acc, b: None, 19, "prefix_lens"),
    "prefix at the cache's end": (lambda acc, b: None, 20, "prefix_lens"),
    "negative prefix": (lambda acc, b: None, -1, "prefix_lens"),
}


@pytest.mark.parametrize("bad_seq", ["first", "last"])
@pytest.mark.parametrize("layers", [None, 3])
@pytest.mark.parametrize("case", list(ACCEPTED_CASES))
def test_compact_kv_refuses_inconsistent_accepted(case, layers, bad_seq, gen):
    """With the bad sequence last, the old code had already moved the earlier ones."""
    B, S, D = 3, 20, 6
    mutate, prefix_b, arg = ACCEPTED_CASES[case]
    b = 0 if bad_seq == "first" else B - 1
    acc = good_accepted(B)
    mutate(acc, b)
    prefix = torch.tensor([4, 8, 10])
    prefix[b] = prefix_b
    shape = (B, S, D) if layers is None else (layers, B, S, D)
    kv = torch.randn(shape, generator=gen)
    inputs = (kv, prefix, acc.indices, acc.length)
    before = snapshot(*inputs)
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        kdtree.compact_kv(kv, prefix, acc)
    assert_unchanged(inputs, before)


@pytest.mark.parametrize("case", list(GUARD_CASES))
def test_compact_kv_unvalidated_skips_a_sequence_that_leaves_the_cache(case, gen):
    """validate=False on the torch backend: what the CUDA kernel does (the GPU suite checks the
    kernel against this): the bad sequence is untouched, the others are compacted, and no row
    outside the cache (guard rows around it) changes."""
    idx, length, prefix = guard_batch(case)
    acc = Accepted(idx, length, torch.zeros(3, dtype=torch.int32))
    buf = torch.randn(2, 3, GUARD_S + 16, 5, generator=gen)
    kv = buf[:, :, 8:8 + GUARD_S]
    before = buf.clone()
    kdtree.compact_kv(kv, prefix, acc, validate=False)
    want = before.clone()
    for b in (0, 2):
        P = int(prefix[b])
        want[:, b, 8 + P:8 + P + 3] = before[:, b, 8 + P + idx[b, :3].long()]
    assert torch.equal(buf, want)
    with pytest.raises(ValueError, match="^(accepted|prefix_lens)"):
        kdtree.compact_kv(kv, prefix, acc)
    assert torch.equal(buf, want)


def test_compact_kv_accepts_the_edges(gen):
    """The last row of the cache and a full-length walk are inside the rules."""
    B, S, D = 2, 20, 4
    acc = good_accepted(B)
    acc.indices[1] = torch.arange(M, dtype=torch.int32)
    acc.length[1] = M
    prefix = torch.tensor([S - 5, S - M])  # sequence 0 reads row S - 1; sequence 1 writes it
    kv = torch.randn(B, S, D, generator=gen)
    before = kv.clone()
    kdtree.compact_kv(kv, prefix, acc)
    assert torch.equal(kv[0, S - 4], before[0, S - 3]) and torch.equal(kv[0, S - 3], before[0, S - 1])
    assert torch.equal(kv[1], before[1])  # indices[i] == i moves nothing


STRUCT_CASES = {  # name -> (call arguments from (kv, prefix, acc), error, argument named)
    "kv not a tensor": (lambda kv, p, a: (kv.numpy(), p, a), TypeError, "kv"),
    "kv 2-D": (lambda kv, p, a: (kv[0], p, a), ValueError, "kv"),
    "kv rows not contiguous": (lambda kv, p, a: (kv[..., ::2], p, a), ValueError, "kv"),
    "accepted a tuple": (lambda kv, p, a: (kv, p, (a.indices, a.length, a.bonus)), TypeError, "accepted"),
    "indices int64": (lambda kv, p, a: (kv, p, Accepted(a.indices.long(), a.length, a.bonus)), TypeError,
                      "accepted.indices"),
    "length int64": (lambda kv, p, a: (kv, p, Accepted(a.indices, a.length.long(), a.bonus)), TypeError,
                     "accepted.length"),
    "indices 1-D": (lambda kv, p, a: (kv, p, Accepted(a.indices[0], a.length, a.bonus)), ValueError,
                    "accepted.indices"),
    "indices transposed": (lambda kv, p, a: (kv, p, Accepted(a.indices.t().contiguous().t(), a.length, a.bonus)),
                           ValueError, "accepted.indices"),
    "no indices per row": (lambda kv, p, a: (kv, p, Accepted(a.indices[:, :0], a.length, a.bonus)), ValueError,
                           "accepted.indices"),
    "too many indices per row": (lambda kv, p, a: (kv, p, Accepted(
        torch.zeros(2, MAX_DEPTH + 2, dtype=torch.int32), a.length, a.bonus)), ValueError, "accepted.indices"),
    "indices for another batch": (lambda kv, p, a: (kv, p, Accepted(a.indices[:1], a.length, a.bonus)), ValueError,
                                  "accepted"),
    "length for another batch": (lambda kv, p, a: (kv, p, Accepted(a.indices, a.length[:1], a.bonus)), ValueError,
                                 "accepted"),
    "prefix_lens float": (lambda kv, p, a: (kv, p.float(), a), TypeError, "prefix_lens"),
    "prefix_lens for another batch": (lambda kv, p, a: (kv, p[:1], a), ValueError, "prefix_lens"),
    "backend unknown": (lambda kv, p, a: (kv, p, a, "triton"), ValueError, "backend"),
    "backend cuda on CPU": (lambda kv, p, a: (kv, p, a, "cuda"), ValueError, "backend"),
}


@pytest.mark.parametrize("case", list(STRUCT_CASES))
def test_compact_kv_bad_arguments(case, gen):
    kv = torch.randn(2, 20, 8, generator=gen)
    prefix, acc = torch.tensor([3, 7]), good_accepted(2)
    make, exc, arg = STRUCT_CASES[case]
    inputs = (kv, prefix, acc.indices, acc.length)
    before = snapshot(*inputs)
    with pytest.raises(exc, match=rf"^{arg}:"):
        kdtree.compact_kv(*make(kv, prefix, acc))
    assert_unchanged(inputs, before)


# --- topk_logprobs: rows that are not distributions -----------------------------------------------

TOPK_CASES = {  # name -> new contents of the bad row, words of the message
    "NaN entry": (lambda r: r.index_fill(0, torch.tensor([7]), float("nan")), "contains NaN"),
    "NaN row": (lambda r: torch.full_like(r, float("nan")), "contains NaN"),
    "+inf entry": (lambda r: r.index_fill(0, torch.tensor([3]), float("inf")), r"contains \+inf"),
    "all -inf row": (lambda r: torch.full_like(r, float("-inf")), "has no finite value"),
}
TOPK_SHAPES = {(2, 3, 50): (1, 2), (4, 50): (3,), (50,): ()}  # logits shape -> the bad row


@pytest.mark.parametrize("shape", list(TOPK_SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("case", list(TOPK_CASES))
def test_topk_logprobs_refuses_rows_without_a_distribution(case, dtype, shape, gen):
    logits = torch.randn(shape, generator=gen).to(dtype)
    row = TOPK_SHAPES[shape]
    fill, words = TOPK_CASES[case]
    logits[row] = fill(logits[row])
    before = snapshot(logits)
    with pytest.raises(ValueError, match=rf"^logits: row {re.escape(str(row))} {words}"):
        kdtree.topk_logprobs(logits, 8)
    assert_unchanged([logits], before)
    # without validation the docstring's promise: that row is NaN, the others are exact
    lp, _ = kdtree.topk_logprobs(logits, 8, validate=False)
    assert torch.isnan(lp[row]).any()
    ok = torch.ones(shape[:-1], dtype=torch.bool)
    ok[row] = False
    assert torch.isfinite(lp[ok]).all()
    if len(shape) == 3:
        with pytest.raises(ValueError, match="^logprobs: contains NaN"):
            kdtree.build_tree(lp, torch.zeros_like(lp, dtype=torch.long), 4)


def test_topk_logprobs_clamps_masked_tokens(gen):
    """-inf entries in a row that has finite ones: as the docstring says, the float32 minimum."""
    logits = torch.randn(2, 40, generator=gen)
    logits[0, 3:] = float("-inf")
    lp, tok = kdtree.topk_logprobs(logits, 10)
    fmin = torch.finfo(torch.float32).min
    assert (lp[0, 3:] == fmin).all() and torch.isfinite(lp).all()
    assert set(tok[0, :3].tolist()) == {0, 1, 2}
    assert torch.allclose(lp[0, :3].exp().sum(), torch.tensor(1.0))


@pytest.mark.parametrize("k", [0, 51, 1025, 2.0, True, None])
def test_topk_logprobs_bad_k(k, gen):
    with pytest.raises(ValueError, match="^k:"):
        kdtree.topk_logprobs(torch.randn(3, 2000 if k == 1025 else 50, generator=gen), k)


# --- meta tensors and tensors that require grad, for every tensor argument of every op --------------

def _attention_args(gen):
    B, N, H, P = 1, 3, 8, 4
    tree = Tree.from_parents(torch.tensor([[-1, 0, 0]], dtype=torch.int32))
    q = torch.randn(B, N, H, 576, generator=gen).bfloat16()
    kv = torch.randn(B, P + N, 576, generator=gen).bfloat16()
    return q, kv, torch.tensor([P]), tree


def _op_calls(gen):
    """op -> (callable taking its tensor arguments by name, those arguments)."""
    lp, tok = sorted_logprobs(2, 3, 4, gen)
    tree = chain()
    q, kvh, pl, atree = _attention_args(gen)
    acc = good_accepted(2)
    return {
        "build_tree": (lambda a: kdtree.build_tree(a["logprobs"], a["tokens"], 6, root_tokens=a["root_tokens"]),
                       {"logprobs": lp, "tokens": tok, "root_tokens": torch.tensor([1, 2])}),
        "accept_tree": (lambda a: kdtree.accept_tree(tree, a["target_tokens"]),
                        {"target_tokens": torch.zeros(2, 5, dtype=torch.long)}),
        "compact_kv": (lambda a: kdtree.compact_kv(a["kv"], a["prefix_lens"],
                                                   Accepted(a["accepted.indices"], a["accepted.length"], acc.bonus)),
                       {"kv": torch.randn(2, 20, 8, generator=gen), "prefix_lens": torch.tensor([3, 7]),
                        "accepted.indices": acc.indices, "accepted.length": acc.length}),
        "topk_logprobs": (lambda a: kdtree.topk_logprobs(a["logits"], 4), {"logits": torch.randn(2, 30, generator=gen)}),
        "verify_attention": (lambda a: kdtree.verify_attention(a["q"], a["kv"], a["prefix_lens"], atree, 0.1, "torch"),
                             {"q": q, "kv": kvh, "prefix_lens": pl}),
    }


ARGS = [("build_tree", "logprobs"), ("build_tree", "tokens"), ("build_tree", "root_tokens"),
        ("accept_tree", "target_tokens"), ("compact_kv", "kv"), ("compact_kv", "prefix_lens"),
        ("compact_kv", "accepted.indices"), ("compact_kv", "accepted.length"), ("topk_logprobs", "logits"),
        ("verify_attention", "q"), ("verify_attention", "kv"), ("verify_attention", "prefix_lens")]


@pytest.mark.parametrize("op,arg", ARGS)
def test_meta_tensor_is_refused(op, arg, gen):
    call, args = _op_calls(gen)[op]
    before = snapshot(*args.values())
    bad = dict(args, **{arg: args[arg].to("meta")})
    with pytest.raises(ValueError, match=rf"^{arg}: is a meta tensor"):
        call(bad)
    assert_unchanged(list(args.values()), before)


@pytest.mark.parametrize("op,arg", [(o, a) for o, a in ARGS if a in ("logprobs", "kv", "logits", "q")])
def test_tensor_requiring_grad_is_refused(op, arg, gen):
    call, args = _op_calls(gen)[op]
    before = snapshot(*args.values())
    bad = dict(args, **{arg: args[arg].clone().requires_grad_(True)})
    with pytest.raises(ValueError, match=rf"^{arg}: requires grad"):
        call(bad)
    assert_unchanged(list(args.values()), before)
    assert torch.equal(bad[arg].detach(), args[arg])
