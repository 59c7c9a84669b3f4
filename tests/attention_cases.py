"""Random verify-attention cases and the kernel self-check shared by the attention tests and the
compute-sanitizer runs (``tests/sanitize_attention.py``)."""
from __future__ import annotations

import contextlib
import math

import torch

from kdtree import attention
from kdtree.attention import (_WGMMA_IMPLS, CUDA_VARIANTS, D_QK, D_V, _run_cuda, errors, fused_impl,
                              random_parents, reference_attention)
from kdtree.tree import Tree

REL_TOL, LSE_TOL = 1e-2, 1e-3


def random_case(B, N, H, prefix_lens, gen, device="cpu", extra=0, num_nodes=None):
    """Random (q, kv, prefix_lens, tree) with S = max(prefix) + N + extra; N(0, 1) bf16 values."""
    pl = torch.as_tensor(prefix_lens, dtype=torch.int32)
    nn = torch.full((B,), N) if num_nodes is None else torch.as_tensor(num_nodes)
    tree = Tree.from_parents(random_parents(B, N, nn, gen))
    S = int(pl.max()) + N + extra
    q = torch.randn(B, N, H, D_QK, generator=gen).to(torch.bfloat16)
    kv = torch.randn(B, S, D_QK, generator=gen).to(torch.bfloat16)
    return q.to(device), kv.to(device), pl.to(device), tree_to(tree, device)


def tail_sms(B, N, H, kv_rows, split_head=False) -> int:
    """The smallest SM count (2 to 63) at which a fused pair call of this shape runs a head/tail
    launch (``choose_tail``) whose head runs whole (or, with ``split_head``, in splits); 0 if
    none."""
    for sms in range(2, 64):
        p = attention.launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=kv_rows, num_sms=sms, impl="pair")
        if p.head and (p.splits > 1) == split_head:
            return sms
    return 0


@contextlib.contextmanager
def num_sms(n: int):
    """Plan every launch inside for a GPU of ``n`` SMs (the plans, not the hardware: a small case
    then gets the launches a large one gets on the real SM count)."""
    real = attention._num_sms
    attention._num_sms = lambda index: n
    try:
        yield
    finally:
        attention._num_sms = real


def tree_to(tree: Tree, device) -> Tree:
    """The same tree with every tensor on ``device``."""
    return Tree(tree.tokens.to(device), tree.parents.to(device), tree.depth.to(device),
                tree.num_nodes.to(device), tree.visibility.to(device), tree.draft_depth)


def available_kernels() -> tuple:
    """(impl, layout) pairs of the fused kernel to exercise here: the mma.sync kernel always; where
    ``fused_impl`` picks an sm_90a kernel, the wgmma kernel in both layouts and the tma and pair
    kernels (rows_m)."""
    if fused_impl(torch.cuda.current_device()) in _WGMMA_IMPLS:
        return (("mma", "rows_m"), ("wgmma", "rows_m"), ("wgmma", "rows_n"), ("tma", "rows_m"),
                ("tma_seq", "rows_m"), ("pair", "rows_m"), ("rn72", "rows_n"))
    return (("mma", "rows_m"),)


# (B, N, H, prefix lengths, real nodes): two mask words, an empty prefix, padding rows; a small
# odd tree; and rows_n blocks of every shape: 8 rows (one warpgroup idle), 24 (16 + 8), 40
# (24 + 16), 48 (24 + 24). With splits=1 the second case walks 5 KV tiles (tma: both stages and the
# P handoff reused, an odd tile count).
SELFCHECK_CASES = [(3, 70, 8, [0, 37, 130], [41, 70, 70]),
                   (1, 9, 16, [300], None),
                   (2, 1, 8, [5, 0], None),
                   (2, 3, 8, [70, 0], [3, 2]),
                   (2, 5, 8, [0, 77], [3, 5]),
                   (1, 17, 8, [90], None)]
# Head/tail launches of the pair kernel (choose_tail), planned for a few SMs (tail_sms): (B, N,
# H, prefix lengths, real nodes, head split): a whole head and a split one, ragged and empty
# prefixes.
TAIL_CASES = [(2, 9, 16, [690, 0], None, False), (4, 9, 8, [887, 0, 77, 500], None, True)]


def selfcheck(variants=CUDA_VARIANTS, kernels=None) -> bool:
    """Run CUDA variants (forced split counts too) on small cases vs float64; print, return ok.

    ``kernels`` are the (impl, layout) pairs ``fused`` runs (default: ``available_kernels()``);
    ``cascade`` runs each impl's rows_m kernel. Where ``fused`` runs ``pair``, its head/tail
    launches run on ``TAIL_CASES`` as well (with its other split counts there).
    """
    gen = torch.Generator().manual_seed(1)
    kernels = kernels or available_kernels()
    pair = ("pair", "rows_m") in kernels and "fused" in variants
    cases = [(c, variants, kernels, 0) for c in SELFCHECK_CASES]
    for *c, split_head in TAIL_CASES if pair else ():
        B, N, H, pls, _ = c
        sms = tail_sms(B, N, H, max(pls) + N + 3, split_head)
        if not sms:
            raise ValueError(f"no head/tail plan for the tail case {tuple(c)}")
        cases.append((tuple(c), ("fused",), (("pair", "rows_m"),), sms))
    ok = True
    for (B, N, H, pls, nn), variants_here, kernels_here, sms in cases:
        q, kv, pl, tree = random_case(B, N, H, pls, gen, "cuda", extra=3, num_nodes=nn)
        scale = 1 / math.sqrt(192)
        ref = reference_attention(q.cpu(), kv.cpu(), pl.cpu(), tree_to(tree, "cpu"), scale)
        runs = [("naive", None, None, None)] if "naive" in variants_here else []
        for impl, layout in kernels_here:
            runs += [("fused", s, impl, layout) for s in (None, 1, 3)] if "fused" in variants_here else []
            if "cascade" in variants_here and layout == "rows_m":
                runs.append(("cascade", None, impl, None))
        runs += [("fused", "tail", "pair", "rows_m")] if sms else []
        for v, splits, impl, layout in runs:
            o = (torch.full((B, N, H, D_V), float("nan"), dtype=torch.bfloat16, device="cuda"),
                 torch.full((B, N, H), float("nan"), device="cuda"))
            with num_sms(sms if splits == "tail" else attention._num_sms(0)):
                _run_cuda(v, q, kv, pl, tree, scale, o[0], o[1], splits=None if splits == "tail" else splits,
                          impl=impl, layout=layout)
            torch.cuda.synchronize()
            rel, le, inf_ok = errors(*o, *ref)
            good = rel <= REL_TOL and le <= LSE_TOL and inf_ok
            ok &= good
            print(f"{v:8s} {impl or '':5s} {layout or '':6s} B={B} N={N} H={H} splits={splits}: rel={rel:.2e} "
                  f"lse={le:.2e} {'ok' if good else 'FAIL'}")
    return ok
